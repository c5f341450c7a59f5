"""Generated from proto/ by `make proto`; never edit by hand."""
