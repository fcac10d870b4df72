#!/usr/bin/env python3
"""Reference renderings for kvzap's built-in chat formatters, made with jinja2 from the real templates.

Renders a fixed set of conversations the way Hugging Face's apply_chat_template does (a sandboxed
jinja2 environment with trim_blocks/lstrip_blocks, a json.dumps-based |tojson and raise_exception)
and writes tests/golden/tokenize_chat_templates.json; tests/unit/chat/test_chat_template.cpp compares
kvzap::apply_chat_template with every entry.

  * smollm2:  the template stored in the model file (tokenizer.chat_template of the default model).
  * qwen3:    --qwen3-template FILE   (chat_template of Qwen/Qwen3-0.6B, as .jinja or tokenizer_config.json)
  * llama3.1: --llama31-template FILE (chat_template of meta-llama/Llama-3.1-8B-Instruct)

A format whose template is not given keeps the entries already in the golden file.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_tokenize import GOLDEN, default_model, read_gguf_metadata  # noqa: E402

GOLDEN_FILE = os.path.join(GOLDEN, "tokenize_chat_templates.json")


def conversations():
    """(messages, add_generation_prompt, enable_thinking, date) shared by every format."""
    u = lambda c: {"role": "user", "content": c}  # noqa: E731
    a = lambda c: {"role": "assistant", "content": c}  # noqa: E731
    s = lambda c: {"role": "system", "content": c}  # noqa: E731
    t = lambda c: {"role": "tool", "content": c}  # noqa: E731
    base = [
        [u("Hello!")],
        [s("You are terse."), u("What is 2+2?")],
        [u("Hi"), a("Hello! How can I help?"), u("Tell me a joke.")],
        [s("Be kind."), u("First question"), a("First answer"), u("Second question")],
        [u("  padded with spaces and a newline\n"), a("\n answer with blanks \n")],
        [s("  \tsystem with blanks\n"), u("\u00bfQu\u00e9 tal? \u65e5\u672c\u8a9e \U0001f642")],
        [u("")],
        [u("Think first"), a("<think>\nSome reasoning.\n</think>\n\nThe answer.")],
        [u("q1"), a("<think>r1</think>a1"), u("q2"), a("<think>\n\nr2\n\n</think>\n\na2")],
        [u("q1"), a("<think>r1</think>a1"), u("q2")],
        [u("weather?"), a("Let me check."), t("{\"temp\": 21}"), t("sunny"), a("It is 21 and sunny.")],
        [u("call it"), t("line \"one\"\nline\ttwo\\")],
        [u("a"), s("mid-conversation system"), u("b")],
        [u("<tool_response>\nx\n</tool_response>"), a("<think>kept?</think>reply")],
        [a("assistant speaks first")],
    ]
    out = []
    for i, msgs in enumerate(base):
        out.append((msgs, True, True, "26 Jul 2024"))
        if i in (0, 3, 7, 10):
            out.append((msgs, False, True, "26 Jul 2024"))
        if i in (0, 2, 8):
            out.append((msgs, True, False, "26 Jul 2024"))
        if i in (1, 4):
            out.append((msgs, True, True, "01 Jan 2025"))
    return out


def render(template, msgs, add_generation_prompt, enable_thinking, date, fmt):
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    kwargs = dict(messages=msgs, add_generation_prompt=add_generation_prompt)
    if fmt == "qwen3":
        kwargs["enable_thinking"] = enable_thinking
    if fmt == "llama3.1":
        kwargs.update(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", date_string=date)
    if fmt == "smollm2":
        kwargs.update(bos_token="<|im_start|>", eos_token="<|im_end|>")
    return env.from_string(template).render(**kwargs)


def load_template(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        text = json.loads(text)
        if isinstance(text, dict):
            text = text["chat_template"]
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--qwen3-template")
    ap.add_argument("--llama31-template")
    args = ap.parse_args()

    templates = {}
    meta = {k: v for k, _, v in read_gguf_metadata(args.model)}
    templates["smollm2"] = meta["tokenizer.chat_template"].decode("utf-8")
    if args.qwen3_template:
        templates["qwen3"] = load_template(args.qwen3_template)
    if args.llama31_template:
        templates["llama3.1"] = load_template(args.llama31_template)

    kept = []
    if os.path.exists(GOLDEN_FILE):
        with open(GOLDEN_FILE, encoding="utf-8") as f:
            kept = [e for e in json.load(f) if e["format"] not in templates]
    entries = []
    for fmt, template in templates.items():
        for msgs, gen, think, date in conversations():
            entries.append({"format": fmt, "messages": msgs, "add_generation_prompt": gen,
                            "enable_thinking": think, "date": date,
                            "expected": render(template, msgs, gen, think, date, fmt)})
    entries = kept + entries
    entries.sort(key=lambda e: ["smollm2", "qwen3", "llama3.1"].index(e["format"]))
    with open(GOLDEN_FILE, "w", encoding="utf-8") as f:
        json.dump(entries, f, ensure_ascii=True, indent=1)
        f.write("\n")
    counts = {fmt: sum(e["format"] == fmt for e in entries) for fmt in ("smollm2", "qwen3", "llama3.1")}
    print(f"wrote {len(entries)} renderings to tests/golden/tokenize_chat_templates.json: {counts}")


if __name__ == "__main__":
    main()
