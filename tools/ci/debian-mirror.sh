#!/usr/bin/env bash
# Print the Debian archive URI this machine's apt already uses: `main` (default) or `security`.
# The CI tools fetch from wherever the host is configured to, rather than naming a mirror of their own.
set -euo pipefail
kind=${1:-main}
shopt -s nullglob
files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
uris=$(cat "${files[@]}" 2>/dev/null | grep -v '^[[:space:]]*#' | grep -oE '(https?|ftp|file):/+[^ ]+' || true)
if [ "$kind" = security ]; then
  uri=$(printf '%s\n' "$uris" | grep -m1 -- '-security' || true)
else
  uri=$(printf '%s\n' "$uris" | grep -v -- '-security' | grep -m1 -E '/debian/?$' || true)
fi
[ -n "$uri" ] || { echo "debian-mirror: no Debian $kind archive in this machine's apt sources" >&2; exit 1; }
echo "${uri%/}"
