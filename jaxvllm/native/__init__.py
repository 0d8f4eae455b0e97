"""Native CPU kernels, built on first use with the machine's C++ compiler and called from
XLA through its FFI (see build.py)."""
