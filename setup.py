"""Build of the optional C accelerators (the binlog row codec, which also reads
snapshot chunk rows, the pgoutput row codec, the relay buffer's event selection, the
one decoder of the wire format: the client's and the Spark readers').

Everything else is in pyproject.toml. The extensions are optional: where one
cannot be compiled, databus installs without it and uses its pure-Python path
(same output, slower): the MySQL and PostgreSQL sources' decoders, the buffer's
selection, the client's ``wiredecode`` and the Spark readers' ``fastread``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "databus.sources.mysql._rowcodec",
            ["src/databus/sources/mysql/_rowcodec.c"],
            # #included: snapshot rows, binlog packet framing, the shared encoders
            depends=["src/databus/sources/mysql/_snaptext.c",
                     "src/databus/sources/mysql/_binlogframes.c", "src/databus/core/_cenc.h"],
            optional=True,
            extra_compile_args=["-O2", "-std=c99", "-Wall"],
        ),
        Extension(
            "databus.sources.postgres._pgcodec",
            ["src/databus/sources/postgres/_pgcodec.c"],
            depends=["src/databus/core/_cenc.h"],  # #included: the shared encoders
            optional=True,
            extra_compile_args=["-O2", "-std=c99", "-Wall"],
        ),
        Extension(
            "databus.buffer._select",
            ["src/databus/buffer/_select.c"],
            depends=["src/databus/buffer/_newest.c"],  # #included: newest()
            optional=True,
            libraries=["z"],  # CRC-32 of bytes keys, as zlib.crc32
            extra_compile_args=["-O2", "-std=c99", "-Wall"],
        ),
        Extension(
            "databus.client._wiredecode",
            ["src/databus/client/_wiredecode.c"],
            depends=["src/databus/core/_cenc.h"],  # #included: the event layout, Buf
            optional=True,
            libraries=["z"],  # CRC-32, as zlib.crc32
            extra_compile_args=["-O2", "-std=c99", "-Wall"],
        ),
    ]
)
