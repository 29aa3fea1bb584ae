"""Move N units between two rows of an inventory table in PostgreSQL under
the fencekv lock "inventory", fenced: the transaction checks the lease's
token against the fence (fencekv.sqlfence) before it writes, so a holder
that paused past its lease cannot commit over a newer one.

    FENCEKV_ADDR=127.0.0.1:7420 DATABASE_URL=postgres://localhost/shop \\
        python3 inventory.py apple pear 5
"""
import os
import sys

import psycopg

import fencekv
from fencekv import sqlfence


def main(src: str, dst: str, n: int) -> int:
    if n < 1:
        raise SystemExit(f"inventory: N {n}: want a positive integer")
    addrs = os.environ.get("FENCEKV_ADDR", "127.0.0.1:7420")
    with fencekv.Client(addrs) as client, \
            psycopg.connect(os.environ.get("DATABASE_URL", "postgres://localhost/shop")) as conn:
        try:
            # with_lock: acquire (queueing up to 30s), BEGIN, check the token
            # against the fence, run the block, COMMIT unless the lease may
            # be lost (then LeaseLost and a rollback), release.
            with sqlfence.with_lock(client, conn, "inventory", ttl=10, wait=30) as lease:
                row = conn.execute("UPDATE inventory SET qty = qty - %s WHERE sku = %s AND qty >= %s "
                                   "RETURNING qty", (n, src, n)).fetchone()
                if row is None:
                    raise ValueError(f"take {n} from {src}: not that many (or no such sku)")
                now = conn.execute("UPDATE inventory SET qty = qty + %s WHERE sku = %s RETURNING qty",
                                   (n, dst)).fetchone()
                if now is None:
                    raise ValueError(f"put {n} into {dst}: no such sku")
                print(f"moved {n} from {src} to {dst} under token {lease.token}: "
                      f"{src} {row[0]}, {dst} {now[0]}")
        except fencekv.StaleToken as e:  # a newer holder wrote first: nothing of ours landed
            print(f"inventory: refused, nothing written: {e} (fence {e.fence})", file=sys.stderr)
            return 1
        except (ValueError, fencekv.Error) as e:  # rolled back, the lock released
            print(f"inventory: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: inventory.py FROM TO N")
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
