# The Python package (pyproject.toml, setup.py, python/poolshim; docs/python.md).
#
#   make check-python   build the wheel in a fresh virtual environment, install it,
#                       run the bundled CLI and the module's tests (tests/python);
#                       skipped (exit 0) where `python3 -m venv` is unavailable
#
# PYTHON picks the interpreter; the C build goes into a temporary directory.
PYTHON ?= python3

.PHONY: check-python python-static-libs
check-python:
	@PYTHON="$(PYTHON)" ./tests/python/check.sh

# For setup.py: the static libraries the Makefile would link (empty when missing).
python-static-libs:
	@echo "INIH_LIB=$(INIH_LIB)"
	@echo "JANSSON_LIB=$(JANSSON_LIB)"
	@echo "ZLIB_LIB=$(ZLIB_LIB)"
