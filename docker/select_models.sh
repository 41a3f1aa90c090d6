#!/bin/sh
# select-models MODELS FROM TO: copy the models named in MODELS (comma-separated; empty: every model
# in FROM) into TO, so an image holds, exports and serves exactly those. An unknown name fails the build.
set -eu
models="$1" from="$2" to="$3"
mkdir -p "$to"
if [ -z "$models" ]; then
    cp -r "$from"/. "$to"/
    exit 0
fi
for model in $(echo "$models" | tr ',' ' '); do
    if [ ! -d "$from/$model" ]; then
        echo "MODELS: no model '$model' in $from (there are: $(ls "$from" | tr '\n' ' '))" >&2
        exit 1
    fi
    cp -r "$from/$model" "$to/$model"
done
