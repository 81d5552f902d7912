"""The product shell: the command line, the one builder, the request harness and the benchmark."""
