"""Issue 32: chat templates that build huge values through Jinja's own
functions -- including while Jinja folds constants at compile time -- are
refused quickly, with a clear message, in bounded memory."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from app.chat.template import ChatTemplate, TemplateRenderError
from tests.conftest import REPO

MESSAGES = [{"role": "user", "content": "hi"}]

PROBES = [
    ("{{ lipsum(n=300000) }}", "lipsum"),
    ("{% set big = range(100000)|list %}{% for i in range(100000) %}{{ big|sort|length }}{% endfor %}", "steps"),
    ("{{ 'a'|center(1000000000) }}", "width of 1000000000"),
    ("{{ 'a'.center(1000000000) }}", "width of 1000000000"),
    ("{{ 'a'.ljust(1000000000) }}", "width of 1000000000"),
    ("{{ '%1000000000s'|format('a') }}", "width of 1000000000"),
    ("{{ '%*s'|format(1000000000, 'a') }}", "width of 1000000000"),
    ("{{ '%1000000000s' % 'a' }}", "width of 1000000000"),
    ("{{ '{:>1000000000}'.format('a') }}", "width of 1000000000"),
    ("{{ '{:>{w}}'.format('a', w=1000000000) }}", "width of 1000000000"),
    ("{{ 'a'|indent(1000000000, true) }}", "line indent"),
    ("{{ ('x' * 4000000)|replace('x', 'yyyyyyyy') }}", "characters"),
    ("{{ ('x' * 4000000).replace('x', 'yyyyyyyy') }}", "characters"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "characters"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "characters"),
    ("{% set x %}{% for i in range(100000) %}{{ 'y' * 4000000 }}{% endfor %}{% endset %}{{ x|length }}", "characters"),
    ("{% macro m() %}{% for i in range(100000) %}{{ 'y' * 4000 }}{% endfor %}{% endmacro %}{{ m()|length }}",
     "characters"),
    ("{{ [1]|batch(1000000000, 'x')|list|length }}", "batch size"),
    ("{{ [1]|slice(1000000000)|list|length }}", "slices"),
    ("{{ ('x' * 4000000).join(range(100000)) }}", "characters"),
    ("{{ range(100000)|join('x' * 4000000) }}", "characters"),
    ("{{ ('x' * 3000000)|wordwrap(1, wrapstring='yyyyyyyy') }}", "characters"),
    ("{{ {'a': 1}|tojson(indent=1000000000) }}", "JSON indent"),
    ("{{ ('x' * 4000000)|list|sort|length }}", "100000 items"),
    ("{{ 'a\tb'.expandtabs(1000000000) }}", "characters"),
]


@pytest.mark.parametrize("source, words", PROBES)
def test_a_template_building_a_huge_value_is_refused_quickly(source, words):
    t0 = time.monotonic()
    with pytest.raises(TemplateRenderError) as info:
        ChatTemplate(source).render(MESSAGES)
    assert time.monotonic() - t0 < 8
    assert words in str(info.value) and str(info.value).startswith("the chat template")


_CHILD = """
import json, resource, sys, time
from app.chat.template import ChatTemplate, TemplateRenderError
out = []
for src in json.loads(sys.argv[1]):
    t0 = time.monotonic()
    try:
        ChatTemplate(src).render([{"role": "user", "content": "hi"}])
        out.append(["rendered", time.monotonic() - t0])
    except TemplateRenderError as exc:
        out.append([str(exc), time.monotonic() - t0])
# the peak of this process's own memory (ru_maxrss would include the parent's, kept across exec on Linux)
try:
    peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
except OSError:
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // (1024 if sys.platform == "darwin" else 1)
out.append(peak_kb)
print(json.dumps(out))
"""


def test_the_issues_probes_stay_within_memory_even_while_compiling():
    """lipsum(n=300000), a loop of big|sort and 'a'|center(1000000000) (Jinja
    folds that one at compile time) in a process limited to 2 GB of address
    space: each is refused, and the process never grew past a few hundred MB."""
    probes = ["{{ lipsum(n=300000) }}",
              "{% set big = range(100000)|list %}{% for i in range(100000) %}{{ big|sort|first }}{% endfor %}",
              "{{ 'a'|center(1000000000) }}", "{% set w = 1000000000 %}{{ 'a'|center(w) }}"]
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
    res = subprocess.run([sys.executable, "-c", limit + _CHILD, json.dumps(probes)], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    *results, peak_kb = json.loads(res.stdout)
    for (message, seconds), src in zip(results, probes):
        assert message.startswith("the chat template") and seconds < 8, (src, message, seconds)
    assert peak_kb < 512 << 10


def test_real_template_idioms_still_render():
    t = ChatTemplate("{{ '%02d'|format(3) }}|{{ '{:>5}'.format('a') }}|{{ messages|map(attribute='role')|join(', ') }}"
                     "|{% set x %}{{ 'a' ~ 'b' }}{% endset %}{{ x|upper }}|{{ [3, 1, 2]|sort|join }}|"
                     "{{ 'x'|center(5) }}|{{ {'a': [1]}|tojson(indent=2) }}|{{ 'a b'|replace(' ', '-') }}")
    out = "".join(text for text, _ in t.render(MESSAGES))
    assert out == '03|    a|user|AB|123|  x  |{\n  "a": [\n    1\n  ]\n}|a-b'
