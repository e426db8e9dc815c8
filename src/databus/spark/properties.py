"""``python -m databus.spark.properties``: a Spark properties file for applications that
Python does not start, such as ``spark-pipelines run`` (Spark Declarative Pipelines) or a
``spark-submit`` of a JVM job.

Prints (or writes to ``--out``) what :func:`databus.spark.session.properties` returns for
the Spark line of the pyspark this interpreter imports: ``spark.jars`` (the lakehouse jars
of that line and the JVM reader built for it), ``spark.sql.extensions`` and the catalogs,
one ``key value`` per line, the ``spark-defaults.conf`` format. Use it as
``$SPARK_CONF_DIR/spark-defaults.conf`` or ``spark-submit --properties-file``. A format the
line has no jars for (Iceberg on 4.2) is a one-line error and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from databus.core.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m databus.spark.properties",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--lakehouse", default=None,
                   help="comma-separated formats (delta,iceberg); default: every format "
                        "the Spark line has jars for; '' for none")
    p.add_argument("--warehouse", default=None, help="the Iceberg catalog's warehouse")
    p.add_argument("--iceberg-catalog", default="local")
    p.add_argument("--out", type=Path, default=None, help="write here instead of stdout")
    args = p.parse_args(argv)
    from databus.spark.session import properties

    lakehouse = None if args.lakehouse is None else \
        [f.strip() for f in args.lakehouse.split(",") if f.strip()]
    try:
        props = properties(lakehouse, warehouse=args.warehouse,
                           iceberg_catalog=args.iceberg_catalog)
    except ConfigError as e:
        print(e, file=sys.stderr)  # the message names where it comes from
        return 2
    text = "".join(f"{k} {v}\n" for k, v in props.items())
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
