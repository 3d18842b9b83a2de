{{/* Environment variables the chart's vLLM no longer reads (deploykit.vllm_removed: the release tables and
the history before them), refused when the release is installed: a name in `extraEnv` (or `env`) that vLLM
removed by the chart's release would be ignored without a word, the setting it stood for silently lost. The
list is the chart's files/vllm-removed-env.json, written by `deploykit render helm` for the release the chart
runs (its image tag): a name ending a prefix entry (`VLLM_TORCH_PROFILER_`) matches every name under it but
those the release defines again (`except`). One line names the variable, the release and what replaces it. */}}
{{- define "deploykit.refuseRemovedEnv" -}}
{{- $file := "files/vllm-removed-env.json" -}}
{{- $text := .Files.Get $file -}}
{{- if not $text -}}
{{- fail (printf "the chart has no %s: render the chart again with deploykit render helm" $file) -}}
{{- end -}}
{{- $known := fromJson $text -}}
{{- $given := list -}}
{{- range $item := .Values.extraEnv | default list -}}
{{- $given = append $given (list "extraEnv" (toString $item.name)) -}}
{{- end -}}
{{- range $name, $_ := .Values.env | default dict -}}
{{- $given = append $given (list "env" $name) -}}
{{- end -}}
{{- range $pair := $given -}}
{{- $where := index $pair 0 -}}
{{- $name := index $pair 1 -}}
{{- range $entry := $known.removed -}}
{{- $hit := ternary (hasPrefix $entry.name $name) (eq $entry.name $name) $entry.prefix -}}
{{- if and $hit (not (has $name $entry.except)) -}}
{{- fail (printf "%s %s: this chart runs vLLM %s, which no longer reads it: %s" $where $name $known.vllmVersion $entry.why) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
