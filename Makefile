# Convenience targets; the scripts in deploy/ do the work.
PREFIX ?= /usr/local
PYTHON ?= python3

.PHONY: usrbio-install test up
# USRBIO for programs: libhf3fs_api_shared.so, hf3fs_usrbio.h, hf3fs_usrbio.pc
# under $(PREFIX), and the Python module hf3fs_fuse into $(PYTHON)'s environment.
usrbio-install:
	./deploy/install-usrbio.sh --prefix "$(PREFIX)" --python "$(PYTHON)"

test:
	./deploy/test.sh

up:
	./deploy/up.sh
