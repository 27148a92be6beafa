#!/usr/bin/env bash
# Builds Switchyard's default training corpus from a Debian package: the King James Bible
# (Debian 12 `bible-kjv-text`, decoded by the `bible` program of `bible-kjv`; public domain text,
# GPL-2+ program). Called at the end of tools/setup.sh; may be run alone once those packages are
# installed.
#
# Why this text: it is continuous English prose, 4.3 MB, ASCII only, freely licensed, and splits
# naturally into 1189 chapters of a few hundred to a few thousand tokens each (one document per
# chapter). `fortunes` was the alternative: short epigrams (tens of tokens each) or, per file,
# one huge document of unrelated pieces; neither is a good language-modelling document.
#
# Output, in ${SWITCHYARD_DATA_DIR:-$HOME/.cache/switchyard/data}/kjv/ (data/corpus.h reads it):
#   kjv_text_document.bin/.idx  MMIDIDX dataset (uint16), one document per chapter, each ending in
#                               the tokenizer's <|endoftext|> id
#   tokenizer.json              byte-level BPE (data/bpe_tokenizer.h), vocabulary 4096
#                               (4095 byte/merge tokens + <|endoftext|>), trained on the whole
#                               corpus: small enough that a tiny model learns it on a CPU
#   corpus.json                 manifest: source package and version, documents, tokens, vocab
#                               size, sha256 of the .bin
#   kjv.jsonl                   the extracted documents ({"text": ...} per line)
# Idempotent: returns at once when corpus.json names the installed package version and the .bin
# still has its recorded sha256. SWITCHYARD_CORPUS_FORCE=1 rebuilds anyway.
#
# Bazel: plain `bazel build //tools:preprocess` (CI). To use another output base, set
# BAZEL_STARTUP_OPTS, e.g. BAZEL_STARTUP_OPTS=--output_base=/root/.cache/bazel_ob_me.
set -euo pipefail
cd "$(dirname "$0")/.."

NAME=kjv
PACKAGE=bible-kjv-text   # the data; its version is the corpus version
DECODER_PACKAGE=bible-kjv
VOCAB_SIZE=4096
DATA_DIR=${SWITCHYARD_DATA_DIR:-$HOME/.cache/switchyard/data}
OUT=$DATA_DIR/$NAME
PREFIX=${NAME}_text_document
read -r -a BAZEL_STARTUP <<<"${BAZEL_STARTUP_OPTS:-}"

log() { echo "[prepare_corpus] $*" >&2; }

for p in "$PACKAGE" "$DECODER_PACKAGE"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    log "ERROR: Debian package $p is not installed (run tools/setup.sh)"
    exit 1
  fi
done
version=$(dpkg-query -W -f='${Version}' "$PACKAGE")

# Up to date? (manifest names this version and the .bin matches its hash)
if [ "${SWITCHYARD_CORPUS_FORCE:-0}" != 1 ] && [ -f "$OUT/corpus.json" ] &&
   [ -f "$OUT/$PREFIX.idx" ] && [ -f "$OUT/tokenizer.json" ] &&
   python3 - "$OUT/corpus.json" "$version" "$OUT/$PREFIX.bin" <<'EOF'
import hashlib, json, sys
m = json.load(open(sys.argv[1]))
h = hashlib.sha256(open(sys.argv[3], "rb").read()).hexdigest()
sys.exit(0 if m.get("package_version") == sys.argv[2] and m.get("bin_sha256") == h else 1)
EOF
then
  log "ok: $OUT is up to date ($PACKAGE $version)"
  exit 0
fi

start=$(date +%s)
mkdir -p "$DATA_DIR"
stage=$(mktemp -d "$DATA_DIR/.$NAME.tmp.XXXXXX")
chmod 755 "$stage"
trap 'rm -rf "$stage"' EXIT

# 1. Extract: `bible` prints every verse as "  N text" under a "Book C" heading per chapter;
#    -l100000 turns its line wrapping off. One document per chapter: the heading, a blank line,
#    then one verse per line without its number.
log "extracting $PACKAGE $version"
bible -l100000 'gen1:1-rev22:21' </dev/null >"$stage/kjv.txt"
python3 - "$stage/kjv.txt" "$stage/$NAME.jsonl" <<'EOF'
import json, re, sys
docs, title, verses = [], None, []
def flush():
    if title is not None and verses:
        docs.append(title + "\n\n" + "\n".join(verses) + "\n")
for line in open(sys.argv[1], encoding="ascii"):
    line = line.rstrip("\n")
    if not line.strip():
        continue
    m = re.match(r"^\s+\d+ (.*)$", line)
    if m:
        verses.append(m.group(1).strip())
    elif not line[0].isspace():
        flush()
        title, verses = line.strip(), []
    else:
        sys.exit("unexpected line: %r" % line)
flush()
if len(docs) != 1189:
    sys.exit("expected the 1189 chapters of the KJV, got %d" % len(docs))
with open(sys.argv[2], "w") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
EOF

# 2. Tokenizer + dataset.
log "building //tools:preprocess"
bazel "${BAZEL_STARTUP[@]}" build --color=no --curses=no //tools:preprocess
bin=$(bazel "${BAZEL_STARTUP[@]}" info --color=no bazel-bin 2>/dev/null)
"$bin/tools/preprocess" --input "$stage/$NAME.jsonl" --output-prefix "$stage/$PREFIX" \
  --train-vocab-size "$VOCAB_SIZE" --save-tokenizer "$stage/tokenizer.json" --append-eod
rm -f "$stage/kjv.txt"

# 3. Manifest (counts read back from the .idx).
python3 - "$stage" "$PREFIX" "$NAME" "$PACKAGE" "$version" "$VOCAB_SIZE" <<'EOF'
import hashlib, json, os, struct, sys
stage, prefix, name, package, version, vocab = sys.argv[1:7]
idx = open(os.path.join(stage, prefix + ".idx"), "rb").read()
assert idx[:9] == b"MMIDIDX\x00\x00", "bad .idx magic"
seqs, doc_count = struct.unpack_from("<QQ", idx, 18)
tokens = sum(struct.unpack_from("<%di" % seqs, idx, 34))
tok = json.load(open(os.path.join(stage, "tokenizer.json")))
vocab_size = max(max(tok["model"]["vocab"].values()),
                 max([t["id"] for t in tok.get("added_tokens", [])] or [0])) + 1
assert vocab_size == int(vocab), "tokenizer has %d ids, expected %s" % (vocab_size, vocab)
bin_sha = hashlib.sha256(open(os.path.join(stage, prefix + ".bin"), "rb").read()).hexdigest()
manifest = {
    "name": name,
    "source_package": package,
    "package_version": version,
    "extractor": "bible -l100000 gen1:1-rev22:21 (Debian package bible-kjv)",
    "document_unit": "chapter",
    "dataset_prefix": prefix,
    "tokenizer": "tokenizer.json",
    "documents": doc_count - 1,
    "sequences": seqs,
    "tokens": tokens,
    "vocab_size": vocab_size,
    "dtype": "uint16",
    "append_eod": True,
    "bin_sha256": bin_sha,
}
with open(os.path.join(stage, "corpus.json"), "w") as f:
    json.dump(manifest, f, indent=2)
    f.write("\n")
print(json.dumps(manifest, indent=2))
EOF

# 4. Publish: replace the old directory by the staged one.
rm -rf "$OUT"
mv "$stage" "$OUT"
trap - EXIT
log "wrote $OUT in $(($(date +%s) - start)) s"
