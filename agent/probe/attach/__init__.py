"""Zero-code attach: finding the model a training script or an inference worker runs,
and handing the process over to a script's own debugger."""
