"""Generated gRPC stubs of proto/ (regenerate with `make proto`; never edit by hand)."""
