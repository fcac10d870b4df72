#!/usr/bin/env python3
"""kvzap's Jinja renderer against Python jinja2 on the real chat templates.

For every template under tests/golden/templates/ (SmolLM2, Llama 3.1 / 3.2, Qwen2.5, Qwen3, Gemma 3,
Mistral Nemo, Mistral Small 3.2; see SOURCES.md there), renders a set of conversations (system or
not, multi-turn, content blocks, tool definitions, tool calls and tool results where the template has
them, generation prompt on and off, template variables) with

  * transformers' render_jinja_template (apply_chat_template's renderer) when transformers is
    installed, else the same environment rebuilt here: jinja2's ImmutableSandboxedEnvironment with
    trim_blocks and lstrip_blocks, loop controls, json.dumps-based |tojson, raise_exception and
    strftime_now;
  * `kvzap template --template FILE --messages F.json [--add-generation-prompt]`,

and requires byte-identical output. A conversation the template refuses (raise_exception or another
template error) must make kvzap fail too, with a "chat template:" message. Each template needs at
least MIN_RENDERED conversations that render. Exit status 1 on any difference.

  python3 tests/python/check_chat_templates.py [--kvzap build/kvzap] [--only NAME] [--no-transformers] [-v]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TEMPLATES = os.path.join(ROOT, "tests", "golden", "templates")
MIN_RENDERED = 30

# name -> (file, bos_token, eos_token, features)
CATALOGUE = {
    "smollm2": ("HuggingFaceTB-SmolLM2-135M-Instruct.jinja", "<|im_start|>", "<|im_end|>", set()),
    "llama3.1": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", {"llama_tools", "builtin_tools"}),
    "llama3.2": ("meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>", {"llama_tools"}),
    "qwen2.5": ("Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|im_end|>", {"qwen_tools"}),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>", {"qwen_tools", "reasoning"}),
    "gemma3": ("google-gemma-3-it.jinja", "<bos>", "<eos>", {"blocks"}),
    "mistral-nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>", {"mistral_tools"}),
    "mistral-small-3.2": ("Mistral-Small-3.2-24B-Instruct-2506.jinja", "<s>", "</s>", {"mistral_tools", "blocks"}),
}


def u(c):
    return {"role": "user", "content": c}


def a(c):
    return {"role": "assistant", "content": c}


def s(c):
    return {"role": "system", "content": c}


def tool(c, **kw):
    return {"role": "tool", "content": c, **kw}


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web; returns snippets.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
                       "required": ["query"]},
        "return": {"type": "string"},
    },
}


def call(name, args, id_=None, wrap=True):
    fn = {"name": name, "arguments": args}
    c = {"type": "function", "function": fn} if wrap else dict(fn)
    if id_ is not None:
        c["id"] = id_
    return c


def plain_conversations():
    """(messages, extra variables) every template gets."""
    long_text = " ".join(f"word{i}" for i in range(400))
    conv = [
        [u("Hello!")],
        [s("You are terse."), u("What is 2+2?")],
        [u("Hi"), a("Hello! How can I help?"), u("Tell me a joke.")],
        [s("Be kind."), u("First question"), a("First answer"), u("Second question")],
        [u("  padded with spaces and a newline\n"), a("\n answer with blanks \n"), u("ok")],
        [s("  \tsystem with blanks\n"), u("\u00bfQu\u00e9 tal? \u65e5\u672c\u8a9e \U0001f642")],
        [u("")],
        [u("Think first"), a("<think>\nSome reasoning.\n</think>\n\nThe answer."), u("next")],
        [u("q1"), a("<think>r1</think>a1"), u("q2"), a("<think>\n\nr2\n\n</think>\n\na2"), u("q3")],
        [u("quotes \"double\" and 'single' and \\backslash")],
        [s("sys"), u("a"), a("b"), u("c"), a("d"), u("e")],
        [u("{{ not a template }} {% if x %} {# c #}")],
        [u("line1\nline2\r\nline3\ttab\x0bvt")],
        [u("<|im_start|>user\nspecial tokens in content<|im_end|>")],
        [u("q"), a("a final answer")],
        [u(long_text)],
        [u("emoji \U0001f469\u200d\U0001f469\u200d\U0001f467 and e\u0301 and \u00a0nbsp\u2028")],
        [u("a"), s("mid-conversation system"), u("b")],
        [a("assistant speaks first")],
        [],
        [s("only a system message")],
        [u("x"), a("y"), u("z"), a("w")],
        [u("trailing newline\n\n")],
        [s("S"), u("U1"), a("A1"), u("U2"), a("A2"), u("U3"), a("A3"), u("U4")],
    ]
    out = [(c, {}) for c in conv]
    out.append(([u("Think or not?")], {"enable_thinking": False}))
    out.append(([u("q1"), a("<think>r</think>a"), u("q2")], {"enable_thinking": False}))
    out.append(([s("dated"), u("What day is it?")], {"date_string": "01 Jan 2025"}))
    return out


def tool_conversations(features):
    out = []
    if "llama_tools" in features:
        tools = [WEATHER, SEARCH]
        out += [
            ([u("What's the weather in Paris?")], {"tools": tools}),
            ([s("Use tools."), u("Weather in Paris?")], {"tools": tools}),
            ([s("Use tools."), u("Weather in Paris?")], {"tools": tools, "tools_in_user_message": False}),
            ([u("Weather?"), {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"})]},
              tool("{\"temp\": 21}"), a("It is 21 degrees.")], {"tools": tools}),
            ([u("Weather?"), {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"})]},
              {"role": "ipython", "content": {"temp": 21, "sky": "clear"}}], {"tools": tools}),
            ([u("Weather?"), {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"})]},
              tool(["a", "list", 3])], {}),
            ([u("Two calls?"), {"role": "assistant", "tool_calls": [call("a", {}), call("b", {})]}], {"tools": tools}),
            ([s("only system")], {"tools": tools}),
            ([u("custom")], {"custom_tools": [SEARCH]}),
            ([u("dated tools")], {"tools": [WEATHER], "date_string": "05 May 2025"}),
        ]
    if "builtin_tools" in features:
        out += [
            ([u("Search it")], {"builtin_tools": ["brave_search", "wolfram_alpha", "code_interpreter"]}),
            ([u("Search it"), {"role": "assistant", "tool_calls": [call("brave_search", {"query": "kv cache"})]},
              tool("results...")], {"builtin_tools": ["brave_search", "code_interpreter"]}),
            ([u("Search it"), {"role": "assistant", "tool_calls": [call("brave_search", {"query": "x", "k": "3"})]}],
             {"builtin_tools": ["brave_search"], "tools": [WEATHER]}),
        ]
    if "qwen_tools" in features:
        tools = [WEATHER, SEARCH]
        out += [
            ([u("What's the weather in Paris?")], {"tools": tools}),
            ([s("You can call tools."), u("Weather in Paris?")], {"tools": tools}),
            ([s("S"), u("Weather?"), {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Paris"})]},
              tool("{\"temp\": 21}"), tool("sunny"), a("It is 21 and sunny.")], {"tools": tools}),
            ([u("Weather?"), {"role": "assistant", "content": "Let me check.",
                              "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}"), call("search", {"query": "paris", "k": 2})]},
              tool("21"), u("thanks")], {"tools": tools}),
            ([u("Weather?"), {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Rome"}, wrap=False)]},
              tool("hot")], {}),
            ([u("call it"), tool("line \"one\"\nline\ttwo\\")], {}),
            ([tool("a tool message first")], {}),
        ]
    if "reasoning" in features:
        out += [
            ([u("q"), {"role": "assistant", "content": "answer", "reasoning_content": "because"}, u("q2")], {}),
            ([u("q"), {"role": "assistant", "content": "answer", "reasoning_content": "because"}], {}),
            ([u("q"), {"role": "assistant", "content": "<think>in content</think>answer"}], {}),
            ([u("<tool_response>\nx\n</tool_response>"), a("<think>kept?</think>reply")], {}),
            ([u("q"), a("<think>r</think>a"), u("<tool_response>\nt\n</tool_response>"), a("<think>r2</think>b")], {}),
            ([u("q"), {"role": "assistant", "content": "x", "reasoning": "old field name"}], {}),
        ]
    if "mistral_tools" in features:
        tools = [WEATHER, SEARCH]
        out += [
            ([u("What's the weather in Paris?")], {"tools": tools}),
            ([s("S"), u("first"), a("reply"), u("Weather in Paris?")], {"tools": tools}),
            ([u("Weather?"), {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"}, "abc123XYZ")]},
              tool("{\"temp\": 21}", tool_call_id="abc123XYZ"), a("It is 21.")], {"tools": tools}),
            ([u("Weather?"), {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"}, "abc123XYZ"),
                                                                  call("search", {"query": "q"}, "zzzzzzzz9")]},
              tool("21", tool_call_id="abc123XYZ"), tool({"content": "nested"}, tool_call_id="zzzzzzzz9"), u("thanks")],
             {"tools": tools}),
            ([u("Weather?"), {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"}, "short")]}], {}),
            ([u("Weather?"), {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris"}, "abc123XYZ")]},
              tool("21")], {}),
        ]
    if "blocks" in features:
        out += [
            ([u([{"type": "text", "text": "  describe this  "}, {"type": "image"}])], {}),
            ([s([{"type": "text", "text": "block system"}]), u([{"type": "image"}, {"type": "text", "text": "what?"}])], {}),
            ([u("q"), a([{"type": "text", "text": "block answer"}]), u("more")], {}),
            ([u([{"type": "audio"}])], {}),
        ]
    return out


def default_model():
    if os.environ.get("KVZAP_MODEL"):
        return os.environ["KVZAP_MODEL"]
    d = os.environ.get("KVZAP_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kvzap", "models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def make_env():
    """The apply_chat_template environment, rebuilt (used when transformers is not installed)."""
    import jinja2.ext
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def alias_reasoning(messages):
    out = []
    for m in messages:
        if isinstance(m, dict):
            r = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
            if r is not None:
                m = {"thinking": r, **m, "reasoning_content": r}
        out.append(m)
    return out


class PythonRenderer:
    def __init__(self, use_transformers=True):
        self.hf = None
        if use_transformers:
            try:
                from transformers.utils.chat_template_utils import render_jinja_template
                render_jinja_template([[{"role": "user", "content": "x"}]], chat_template="{{ messages[0].content }}")
                self.hf = render_jinja_template
                self.name = "transformers.utils.chat_template_utils.render_jinja_template"
            except Exception:  # noqa: BLE001 - not installed, too old, or needs a newer jinja2: our own environment
                self.hf = None
        if self.hf is None:
            self.env = make_env()
            self.compiled = {}
            self.name = "jinja2 (apply_chat_template's environment rebuilt)"

    def render(self, template, messages, add_generation_prompt, bos, eos, extra):
        """Returns (text, None) or (None, error message)."""
        kwargs = dict(extra)
        tools = kwargs.pop("tools", None)
        try:
            if self.hf:
                rendered, _ = self.hf([messages], tools=tools, chat_template=template,
                                      add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos, **kwargs)
                return rendered[0], None
            if template not in self.compiled:
                self.compiled[template] = self.env.from_string(template)
            return self.compiled[template].render(messages=alias_reasoning(messages), tools=tools, documents=None,
                                                  add_generation_prompt=add_generation_prompt, bos_token=bos,
                                                  eos_token=eos, **kwargs), None
        except Exception as e:  # noqa: BLE001 - jinja2 errors of every kind count as "the template refuses"
            return None, f"{type(e).__name__}: {e}"


def kvzap_render(kvzap, template_path, case_path, add_generation_prompt, bos, eos):
    cmd = [kvzap, "template", "--template", template_path, "--messages", case_path, "--bos-token", bos, "--eos-token", eos]
    if add_generation_prompt:
        cmd.append("--add-generation-prompt")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvzap", default=os.environ.get("KVZAP_BIN", os.path.join(ROOT, "build", "kvzap")))
    ap.add_argument("--only", help="check one template of the catalogue")
    ap.add_argument("--no-transformers", action="store_true", help="use the rebuilt environment even if transformers is installed")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    try:
        import jinja2  # noqa: F401
    except ImportError:
        print("check_chat_templates: jinja2 is not installed (pip install jinja2)", file=sys.stderr)
        return 1
    if not os.path.exists(args.kvzap):
        print(f"check_chat_templates: {args.kvzap} not found (build first or set KVZAP_BIN)", file=sys.stderr)
        return 1
    py = PythonRenderer(not args.no_transformers)
    print(f"reference renderer: {py.name}")
    failures = 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (fname, bos, eos, features) in CATALOGUE.items():
            if args.only and name != args.only:
                continue
            path = os.path.join(TEMPLATES, fname)
            with open(path, encoding="utf-8") as f:
                template = f.read()
            cases = plain_conversations() + tool_conversations(features)
            rendered = refused = bad = 0
            for ci, (messages, extra) in enumerate(cases):
                for agp in (True, False):
                    want, err = py.render(template, messages, agp, bos, eos, extra)
                    case_path = os.path.join(tmp, f"{name}-{ci}.json")
                    with open(case_path, "w", encoding="utf-8") as f:
                        json.dump({"messages": messages, **extra}, f, ensure_ascii=False)
                    rc, out, stderr = kvzap_render(args.kvzap, path, case_path, agp, bos, eos)
                    label = f"{name} case {ci} (add_generation_prompt={agp}) {json.dumps(messages, ensure_ascii=False)[:160]} {extra}"
                    if err is not None:
                        if rc != 0 and "chat template" in stderr:
                            refused += 1
                            if args.verbose:
                                print(f"  both refuse: {label}\n    python: {err}\n    kvzap:  {stderr.strip()}")
                        else:
                            bad += 1
                            print(f"!! {label}: Python refuses ({err}) but kvzap rc={rc}: {out[:300]!r} {stderr.strip()}")
                        continue
                    if rc != 0:
                        bad += 1
                        print(f"!! {label}: kvzap failed (rc={rc}): {stderr.strip()}")
                        continue
                    got = out.decode("utf-8", "replace")
                    if got != want:
                        bad += 1
                        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
                        print(f"!! {label}: differs at char {i}\n    want {want[max(0, i - 40):i + 80]!r}\n    got  {got[max(0, i - 40):i + 80]!r}")
                        continue
                    rendered += 1
            ok = bad == 0 and rendered >= MIN_RENDERED
            failures += 0 if ok else 1
            rows.append((name, rendered, refused, bad, ok))
        # The default model's own tokenizer.chat_template, read from the GGUF file by `kvzap template -m`.
        model = default_model()
        if not args.only or args.only == "smollm2":
            if not os.path.exists(model):
                print(f"!! default model not found at {model}: run `kvzap pull` (the -m check is skipped)")
                failures += 1
            else:
                fname, bos, eos, _ = CATALOGUE["smollm2"]
                with open(os.path.join(TEMPLATES, fname), encoding="utf-8") as f:
                    template = f.read()
                n_ok = 0
                for ci, (messages, extra) in enumerate(plain_conversations()[:6]):
                    case_path = os.path.join(tmp, f"model-{ci}.json")
                    with open(case_path, "w", encoding="utf-8") as f:
                        json.dump({"messages": messages, **extra}, f, ensure_ascii=False)
                    want, _ = py.render(template, messages, True, bos, eos, extra)
                    p = subprocess.run([args.kvzap, "template", "-m", model, "--messages", case_path, "--add-generation-prompt"],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                    if p.returncode != 0 or p.stdout.decode("utf-8", "replace") != want:
                        print(f"!! kvzap template -m {model} differs on case {ci}: {p.stdout[:200]!r} {p.stderr.decode()[:200]}")
                        failures += 1
                    else:
                        n_ok += 1
                print(f"kvzap template -m (the GGUF's own template): {n_ok} conversations identical")
    print(f"{'template':<20} {'identical':>9} {'both refuse':>11} {'differ':>6}")
    for name, rendered, refused, bad, ok in rows:
        print(f"{name:<20} {rendered:>9} {refused:>11} {bad:>6}  {'ok' if ok else 'FAIL'}")
    if failures:
        print(f"check_chat_templates: {failures} template(s) failed (a difference, or fewer than {MIN_RENDERED} rendered)")
        return 1
    print("check_chat_templates: every template renders identically")
    return 0


if __name__ == "__main__":
    sys.exit(main())
