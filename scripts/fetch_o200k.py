"""Put the o200k vocabulary where openai-harmony finds it offline (gpt-oss's Harmony parser).

openai-harmony downloads `o200k_base.tiktoken` from OpenAI's blob store at run time unless
`TIKTOKEN_ENCODINGS_BASE` names a folder holding it. The same file is published on crates.io
inside the `tiktoken-rs` crate; this fetches that crate from the registry, checks the file
against tiktoken's own SHA-256 for o200k_base, and writes it to `tiktoken/` of Sluice's cache
folder, where the parser looks (`$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`, as
`sluice.runtime.cache_dir`: this script runs without Sluice installed, in the image
build), or to the folder given. Idempotent: a file already there with the right hash is kept.

    python scripts/fetch_o200k.py [FOLDER]
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
import urllib.request
from pathlib import Path

CRATE = "tiktoken-rs"
VERSION = "0.7.0"
URL = f"https://static.crates.io/crates/{CRATE}/{CRATE}-{VERSION}.crate"
MEMBER = f"{CRATE}-{VERSION}/assets/o200k_base.tiktoken"
SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # tiktoken's
NAME = "o200k_base.tiktoken"


def fetch(folder: Path) -> Path:
    target = folder / NAME
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == SHA256:
        return target
    with urllib.request.urlopen(URL, timeout=120) as response:
        crate = response.read()
    with tarfile.open(fileobj=io.BytesIO(crate), mode="r:gz") as tar:
        member = tar.extractfile(MEMBER)
        if member is None:
            raise SystemExit(f"{URL} has no {MEMBER}")
        data = member.read()
    if (digest := hashlib.sha256(data).hexdigest()) != SHA256:
        raise SystemExit(f"{MEMBER} in {URL} has SHA-256 {digest}, not o200k_base's {SHA256}")
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.replace(target)
    return target


if __name__ == "__main__":
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sluice" / "tiktoken"
    print(fetch(Path(sys.argv[1]) if len(sys.argv) > 1 else default))
