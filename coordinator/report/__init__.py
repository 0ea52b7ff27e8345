"""report.html: the self-contained page an engineer opens first after an incident."""
