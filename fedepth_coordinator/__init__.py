"""fedepth_coordinator: the gRPC coordinator service of a fedepth fleet (servicer -> handlers -> state)."""
