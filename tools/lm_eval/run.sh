#!/usr/bin/env bash
# lm-evaluation-harness against an OpenAI-compatible server: a loglikelihood task (li_mc: 20
# multiple-choice questions, `local-completions`, echo + logprobs) and a generation task (li_gen:
# 20 one-word answers, 3-shot, through `local-completions` and `local-chat-completions`).
# Offline: the tasks' data are the JSONL files here, the tokenizer is exported from the GGUF.
#
#   tools/lm_eval/run.sh URL MODEL_NAME GGUF   e.g.
#   localinfer serve --model smollm2-135m --port 8011 &
#   tools/lm_eval/run.sh http://127.0.0.1:8011 smollm2-135m ~/.cache/localinfer/models/smollm2-135m/*.gguf
#
# lm-eval and transformers go into their own venv ($LMEVAL_VENV, default /tmp/lmeval), with the
# CPU torch 2.13.0 (an unpinned torch would pull a CUDA build). TOKENIZED=False sends text
# prompts (llama-cpp-python's server refuses token-id prompts).
set -euo pipefail
url=$1 model=$2 gguf=$3
here=$(cd "$(dirname "$0")" && pwd)
venv=${LMEVAL_VENV:-/tmp/lmeval}
if [ ! -x "$venv/bin/lm_eval" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "torch==2.13.0" "lm-eval[api]" transformers gguf sentencepiece
fi
tok="$venv/tokenizers/$model"
if [ ! -f "$tok/tokenizer.json" ]; then
    "$venv/bin/python" -c "
import os, sys
from transformers import AutoTokenizer
path = sys.argv[1]
AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path)).save_pretrained(sys.argv[2])
" "$gguf" "$tok"
fi
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
cd "$here"
common="num_concurrent=1,max_retries=1"
completions="model=$model,base_url=$url/v1/completions,tokenizer=$tok,tokenizer_backend=huggingface,tokenized_requests=${TOKENIZED:-True},$common"
"$venv/bin/lm_eval" --model local-completions --model_args "$completions" --tasks li_mc \
    --include_path "$here" --output_path "${OUT:-/tmp/lm_eval_out}"
"$venv/bin/lm_eval" --model local-completions --model_args "$completions" --tasks li_gen \
    --num_fewshot 3 --include_path "$here" --output_path "${OUT:-/tmp/lm_eval_out}"
"$venv/bin/lm_eval" --model local-chat-completions \
    --model_args "model=$model,base_url=$url/v1/chat/completions,$common" --apply_chat_template \
    --fewshot_as_multiturn --num_fewshot 3 --tasks li_gen --include_path "$here" \
    --output_path "${OUT:-/tmp/lm_eval_out}"
