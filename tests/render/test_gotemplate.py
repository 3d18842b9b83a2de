"""The test-only Go-template interpreter: each construct the chart uses, with the output Go/Helm give,
and a loud refusal of everything else."""

from __future__ import annotations

import pytest

from tests.render.gotemplate import TemplateError, TemplateUnsupported, render

CONTEXT = {
    "Values": {
        "name": "vllm",
        "port": 8000,
        "ratio": 0.92,
        "on": True,
        "off": False,
        "empty": {},
        "env": {"B": "2", "A": "1"},
        "items": ["x", "y"],
        "nested": {"list": ["a", "b"], "map": {"z": 1, "k": "v"}},
        "big": 1000000,
    },
    "Release": {"Name": "rel", "Service": "Helm"},
    "Chart": {"Name": "chart", "Version": "0.1.0"},
}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("name: {{ .Values.name }}", "name: vllm"),
        (
            "port: {{ .Values.port }} ratio: {{ .Values.ratio }} on: {{ .Values.on }}",
            "port: 8000 ratio: 0.92 on: true",
        ),
        ("v: {{ .Values.name | quote }}", 'v: "vllm"'),
        ('v: {{ "a\\"b" | quote }}', 'v: "a\\"b"'),
        (
            "a:\n  {{- toYaml .Values.nested | nindent 2 }}\n",
            "a:\n  list:\n  - a\n  - b\n  map:\n    k: v\n    z: 1\n",
        ),
        ("x:{{ toYaml .Values.items | indent 4 }}", "x:    - x\n    - y"),
        ("a\n  {{- if .Values.on }}\n  yes\n  {{- end }}\nb", "a\n  yes\nb"),
        ("{{ if .Values.off }}T{{ else }}F{{ end }}", "F"),
        ("{{ if .Values.empty }}T{{ else }}F{{ end }}", "F"),
        ("{{ if .Values.items }}T{{ end }}", "T"),
        ("{{ range $k, $v := .Values.env }}{{ $k }}={{ $v }};{{ end }}", "A=1;B=2;"),  # sorted keys
        ("{{ range $v := .Values.items }}[{{ $v }}]{{ end }}", "[x][y]"),
        ("{{ range .Values.items }}<{{ . }}>{{ end }}", "<x><y>"),
        ("{{ range $k, $v := .Values.env }}{{ $.Release.Name }}-{{ $k }} {{ end }}", "rel-A rel-B "),
        ("a {{- /* gone */ -}} b", "ab"),
        ("{{ .Chart.Name }}-{{ .Chart.Version }}", "chart-0.1.0"),
    ],
)
def test_constructs_render_as_helm_does(template: str, expected: str) -> None:
    assert render(template, CONTEXT) == expected


@pytest.mark.parametrize(
    "template",
    [
        '{{ include "x" . }}',
        "{{ with .Values.nested }}{{ end }}",
        "{{ .Values.name | upper }}",
        "{{ default 1 .Values.port }}",
        "{{ $x := 1 }}",
        "{{ .Values.nested }}",  # Go would print map[...]
        "{{ .Values.big }}",  # Helm would print 1e+06
        "{{ if .Values.on }}a{{ else if .Values.off }}b{{ end }}",
    ],
)
def test_unsupported_constructs_are_refused(template: str) -> None:
    with pytest.raises(TemplateUnsupported):
        render(template, CONTEXT)


@pytest.mark.parametrize(
    "template", ["{{ .Values.missing }}", "{{ if .Values.on }}open", "{{ end }}", "{{ $nope }}"]
)
def test_errors_are_loud(template: str) -> None:
    with pytest.raises(TemplateError):
        render(template, CONTEXT)
