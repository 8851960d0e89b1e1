"""fedepth_coordinator: the fleet's gRPC coordinator (servicer -> handlers -> state) and client."""
