"""Messages between the runtime's processes and the ZeroMQ plumbing that carries them."""
