#!/usr/bin/env bash
# Unpacks parts of Debian's CUDA 11.8 toolkit (component non-free) into
# DIR, without installing it, for the nccl package's checks that need no
# GPU:
#
#   scripts/cuda-deps.sh ptxas DIR    DIR/bin/ptxas and DIR/bin/cuobjdump,
#                                     from nvidia-cuda-toolkit (an 84 MB
#                                     download): TestPTXAssembles
#   scripts/cuda-deps.sh headers DIR  DIR/include (cuda.h, cuda_runtime.h,
#                                     ...), from nvidia-cuda-dev (a 774 MB
#                                     download): TestABIAgainstHeaders
#
# Both need root: they add "contrib non-free" to the components of the
# machine's Debian sources entry (deb822 .sources or one-line
# sources.list) where missing, then run apt-get update. Nothing is
# installed: apt-get download fetches the one package, which is unpacked
# into a temporary directory (dpkg -x; the headers alone for
# nvidia-cuda-dev) from which the files are copied. Installing
# nvidia-cuda-dev instead would bring the driver's libcuda.so.1 and
# libnvidia-ml.so.1 onto a machine without a GPU, which changes what
# nccl.Default and ddpbench's NVML probe find there.
set -euo pipefail

what=${1:-}
dir=${2:-}
case "$what" in
ptxas) pkg=nvidia-cuda-toolkit ;;
headers) pkg=nvidia-cuda-dev ;;
*)
	echo "usage: $0 ptxas|headers DIR" >&2
	exit 2
	;;
esac
[ -n "$dir" ] || { echo "usage: $0 $what DIR" >&2; exit 2; }

# etc is apt's configuration directory (another only to try this on a copy).
etc=${APT_ETC:-/etc/apt}

# enable_nonfree adds contrib and non-free to every Debian entry that
# lacks them and says whether it changed anything (exit 0) or not (1).
enable_nonfree() {
	local changed=1 f before
	for f in "$etc"/sources.list.d/*.sources; do
		[ -f "$f" ] && grep -q '^URIs:.*debian' "$f" || continue
		before=$(cat "$f")
		sed -i -E \
			-e '/^Components:/{/[[:space:]]contrib([[:space:]]|$)/!s/[[:space:]]*$/ contrib/}' \
			-e '/^Components:/{/[[:space:]]non-free([[:space:]]|$)/!s/[[:space:]]*$/ non-free/}' "$f"
		[ "$before" = "$(cat "$f")" ] || { echo "$f: added contrib non-free"; changed=0; }
	done
	f=$etc/sources.list
	if [ -f "$f" ] && grep -Eq '^deb(-src)?[[:space:]].*debian' "$f"; then
		before=$(cat "$f")
		sed -i -E \
			-e '/^deb(-src)?[[:space:]].*debian/{/[[:space:]]contrib([[:space:]]|$)/!s/[[:space:]]*$/ contrib/}' \
			-e '/^deb(-src)?[[:space:]].*debian/{/[[:space:]]non-free([[:space:]]|$)/!s/[[:space:]]*$/ non-free/}' "$f"
		[ "$before" = "$(cat "$f")" ] || { echo "$f: added contrib non-free"; changed=0; }
	fi
	return $changed
}

if enable_nonfree || ! apt-cache show "$pkg" >/dev/null 2>&1; then
	apt-get update -qq
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The download runs as root into a directory of root's: apt's sandbox
# user could not write there.
(cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "$pkg")
deb=("$tmp"/"$pkg"_*.deb)
case "$what" in
ptxas) dpkg -x "${deb[0]}" "$tmp/root" ;;
# nvidia-cuda-dev unpacks to 2.8 GB, almost all libraries: only the
# headers are taken out of its archive.
headers) mkdir "$tmp/root" && dpkg-deb --fsys-tarfile "${deb[0]}" | tar -x -C "$tmp/root" ./usr/include ;;
esac

mkdir -p "$dir"
case "$what" in
ptxas)
	mkdir -p "$dir/bin"
	cp "$tmp/root/usr/bin/ptxas" "$tmp/root/usr/bin/cuobjdump" "$dir/bin/"
	"$dir/bin/ptxas" --version | tail -n 1
	;;
headers)
	rm -rf "$dir/include"
	cp -r "$tmp/root/usr/include" "$dir/include"
	[ -f "$dir/include/cuda.h" ] || { echo "$pkg has no usr/include/cuda.h" >&2; exit 1; }
	grep -m1 -E '^#define CUDA_VERSION' "$dir/include/cuda.h"
	;;
esac
