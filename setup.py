"""setuptools entry: builds the C core through cffi (see core_c/build_ferry.py)."""
import os
from concurrent.futures import ThreadPoolExecutor

from setuptools import setup
from setuptools.command.build_ext import build_ext


class BuildExt(build_ext):
    """The core's source files compiled one per compiler process, as many at once as there are cores
    (setuptools compiles one extension's sources one after another: about a minute on one core)."""

    def build_extensions(self):
        one_by_one = self.compiler.compile
        jobs = max(1, min(8, os.cpu_count() or 1))

        def compile(sources, *args, **kwargs):
            with ThreadPoolExecutor(jobs) as pool:
                objs = pool.map(lambda src: one_by_one([src], *args, **kwargs), sources)
                return [obj for batch in objs for obj in batch]

        if jobs > 1:
            self.compiler.compile = compile
        super().build_extensions()


setup(cffi_modules=["core_c/build_ferry.py:ffibuilder"], cmdclass={"build_ext": BuildExt})
