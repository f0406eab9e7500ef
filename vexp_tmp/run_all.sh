#!/bin/bash

export HF_HUB_OFFLINE=1 PYTHONPATH=$PWD:$PWD/build/pylib
O=$1; mkdir -p $O

FEDVLP_CACHE_DIR=/tmp/c timeout 200 python vexp_tmp/exp.py cuda vexp_tmp/variants.txt > $O/variants.txt 2> $O/err.txt
tail -5 $O/err.txt; cat $O/gpu_check.txt $O/variants.txt
