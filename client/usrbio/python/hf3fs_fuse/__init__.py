"""USRBIO for 3FS-KV mounts, with the interface of 3FS's ``hf3fs_fuse``.

``hf3fs_fuse.io`` is the module programs use (``make_iovec``, ``make_ioring``,
``register_fd``, ...). It calls the C library ``libhf3fs_api_shared.so``
through ctypes; install both with ``deploy/install-usrbio.sh``.
"""
