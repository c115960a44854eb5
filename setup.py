"""setuptools entry: builds the C core through cffi (see core_c/build_ferry.py)."""
from setuptools import setup

setup(cffi_modules=["core_c/build_ferry.py:ffibuilder"])
