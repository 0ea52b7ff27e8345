"""``rankscope keys``: CURVE key pairs and allowlists (pyzmq's ``zmq.auth`` certificate files).

    rankscope keys new coordinator --dir keys     # keys/coordinator.key + .key_secret
    rankscope keys new agent --dir keys
    rankscope keys allow keys/agent.key --allow-dir keys/allowed
    rankscope keys list --allow-dir keys/allowed
    rankscope keys show keys/agent.key

The coordinator binds with ``--curve-secret coordinator.key_secret --allow-dir allowed``;
each agent connects with ``--curve-secret agent.key_secret --coordinator-key
coordinator.key``. Only public keys go into an allowlist; secret files are created mode 0600.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from rankscope.files.atomic import atomic_write_bytes

# zmq.auth's certificate text format (ZPL), public key only; zmq.auth.load_certificate reads it.
_PUBLIC_CERT = """#   rankscope allowed client, from {source}
#   ZeroMQ CURVE Public Certificate
metadata
curve
    public-key = "{key}"
"""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


def _load_public(path: Path) -> bytes:
    import zmq.auth

    try:
        public, _ = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"rankscope keys: {path} is not a zmq.auth certificate: {exc}") from None
    if not public or len(public) != 40:
        raise SystemExit(f"rankscope keys: {path} holds no 40-character public key")
    return public


def cmd_new(args: argparse.Namespace) -> int:
    import zmq.auth

    if not _NAME.fullmatch(args.name):
        raise SystemExit(f"rankscope keys new: name {args.name!r} must be letters, digits, '_', '.', '-'")
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    public, secret = d / f"{args.name}.key", d / f"{args.name}.key_secret"
    existing = [str(p) for p in (public, secret) if p.exists()]
    if existing and not args.force:
        raise SystemExit(f"rankscope keys new: {', '.join(existing)} exists; pass --force to replace it")
    old = os.umask(0o077)  # the secret file must never be readable by others, not even briefly
    try:
        pub_file, sec_file = zmq.auth.create_certificates(str(d), args.name)
    finally:
        os.umask(old)
    os.chmod(sec_file, 0o600)
    os.chmod(pub_file, 0o644)
    print(f"public key: {pub_file}\nsecret key: {sec_file}")
    return 0


def cmd_allow(args: argparse.Namespace) -> int:
    allow = Path(args.allow_dir)
    allow.mkdir(parents=True, exist_ok=True)
    for f in map(Path, args.public):
        if f.name.endswith(".key_secret"):
            raise SystemExit(f"rankscope keys allow: {f} is a secret key; give the public .key file")
        key = _load_public(f)
        dest = allow / (f.name if f.name.endswith(".key") else f.name + ".key")
        if dest.exists() and _load_public(dest) != key:
            raise SystemExit(f"rankscope keys allow: {dest} already holds a different key; rename {f}")
        # Write only the public part: a certificate file may carry more than we want to spread.
        atomic_write_bytes(dest, _PUBLIC_CERT.format(source=f.name, key=key.decode()).encode())
        print(f"allowed {key.decode()} ({dest})")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    allow = Path(args.allow_dir)
    if not allow.is_dir():
        raise SystemExit(f"rankscope keys list: {allow} is not a directory")
    for f in sorted(allow.glob("*.key")):
        print(f"{_load_public(f).decode()}  {f.name}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    print(_load_public(Path(args.file)).decode())
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    f = Path(args.allow_dir) / (args.name if args.name.endswith(".key") else args.name + ".key")
    if not f.exists():
        raise SystemExit(f"rankscope keys revoke: {f} does not exist")
    f.unlink()
    print(f"revoked {f.name} (restart the coordinator, or let it re-read the directory on its next bind)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rankscope keys", description="CURVE key pairs and allowlists")
    sub = p.add_subparsers(dest="cmd", required=True, help="what to do")
    n = sub.add_parser("new", help="create NAME.key (public) and NAME.key_secret")
    n.add_argument("name", help="the key pair's name: NAME.key and NAME.key_secret")
    n.add_argument("--dir", default=".", help="output directory (default: .)")
    n.add_argument("--force", action="store_true", help="replace existing files")
    n.set_defaults(fn=cmd_new)
    a = sub.add_parser("allow", help="add public key files to an allowlist directory")
    a.add_argument("public", nargs="+", help="public .key files to admit")
    a.add_argument("--allow-dir", required=True, help="the allowlist directory (made if missing)")
    a.set_defaults(fn=cmd_allow)
    ls = sub.add_parser("list", help="list the keys of an allowlist directory")
    ls.add_argument("--allow-dir", required=True, help="the allowlist directory")
    ls.set_defaults(fn=cmd_list)
    s = sub.add_parser("show", help="print the public key of a certificate file")
    s.add_argument("file", help="a .key or .key_secret file")
    s.set_defaults(fn=cmd_show)
    r = sub.add_parser("revoke", help="remove NAME(.key) from an allowlist directory")
    r.add_argument("name", help="the key to remove: NAME or NAME.key")
    r.add_argument("--allow-dir", required=True, help="the allowlist directory")
    r.set_defaults(fn=cmd_revoke)
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
