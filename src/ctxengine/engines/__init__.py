"""Built-in engines: ``compressor`` (default), ``rules`` and ``lcm``."""
