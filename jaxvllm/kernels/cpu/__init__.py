"""CPU kernels in C++, built on first use with the machine's C++ compiler and called from
XLA through its FFI (see build.py): ragged paged attention and the packed matmul."""
