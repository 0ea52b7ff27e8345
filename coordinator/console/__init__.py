"""The live console: a web page on the coordinator host showing the running job (grid,
verdicts, model tree, tensor view, watchpoints) with its training controls."""
