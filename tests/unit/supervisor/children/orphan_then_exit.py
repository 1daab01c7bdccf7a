"""A stand-in training child: it leaves a process in its session, says its pid on stderr, and exits 3."""

import subprocess
import sys

orphan = subprocess.Popen(["sleep", "300"])
print(f"orphan {orphan.pid}", file=sys.stderr, flush=True)
sys.exit(3)
