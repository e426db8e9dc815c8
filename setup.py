"""Build of the optional C accelerator (the binlog row codec).

Everything else is in pyproject.toml. The extension is optional: where it
cannot be compiled, databus installs without it and the MySQL source uses its
pure-Python decoder (same output, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "databus.sources.mysql._rowcodec",
            ["src/databus/sources/mysql/_rowcodec.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c99", "-Wall"],
        )
    ]
)
