#!/bin/bash
# Cold 4 KiB random reads of DIR/f (fio, psync, one job) with the block
# device's reads counted around them (/proc/diskstats of the disk holding /):
# IOPS, mean latency, device reads and KiB read from the device per fio read.
# Tells a read served by the disk from one served by a page cache that an
# earlier, larger read filled (readahead).
#
#   benches/fs/device-reads.sh DIR [SECONDS] [SIZE]     # DIR/f must exist, at least SIZE (default 256M) long
set -euo pipefail
# shellcheck source=../../deploy/lib.sh
. "$(cd "$(dirname "$0")/../.." && pwd)/deploy/lib.sh"
dir=${1:?usage: device-reads.sh DIR [SECONDS] [SIZE]}
secs=${2:-6}
size=${3:-256M}
dev=$(root_disk)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
sync
echo 3 > /proc/sys/vm/drop_caches
before=$(disk_reads "$dev")
fio --name=r --directory="$dir" --filename=f --ioengine=psync --rw=randread --bs=4k --size="$size" \
    --time_based --runtime="$secs" --output-format=json > "$out"
after=$(disk_reads "$dev")
python3 - "$before" "$after" "$out" "$dev" <<'PY'
import json, sys
reads0, sectors0 = map(int, sys.argv[1].split())
reads1, sectors1 = map(int, sys.argv[2].split())
job = json.load(open(sys.argv[3]))["jobs"][0]["read"]
n = max(job["total_ios"], 1)
reads = reads1 - reads0
print("%s: %.0f IOPS, mean %.1f us; %s reads %d (%.2f per fio read), %.1f KiB per fio read"
      % ("cold 4k randread", job["iops"], job["clat_ns"]["mean"] / 1000, sys.argv[4],
         reads, reads / n, (sectors1 - sectors0) * 512 / 1024 / n))
PY
