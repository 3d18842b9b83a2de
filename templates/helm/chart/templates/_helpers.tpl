{{/* Labels every object carries; the selector is the stable subset. */}}
{{- define "deploykit.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "deploykit.labels" -}}
{{ include "deploykit.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* The vLLM image; its tag is the vLLM version the plan targeted (values.yaml says which). */}}
{{- define "deploykit.vllmImage" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end -}}

{{/* The canary and smoke containers run in the vLLM image the pod already pulls, unless told otherwise. */}}
{{- define "deploykit.canaryImage" -}}
{{ .Values.canary.image | default (include "deploykit.vllmImage" .) }}
{{- end -}}

{{- define "deploykit.smokeImage" -}}
{{ .Values.smokeTest.image | default (include "deploykit.vllmImage" .) }}
{{- end -}}

{{/* The bundled wheel, checked against the sha256 values.yaml pins: a chart whose files/ was swapped fails. */}}
{{- define "deploykit.wheelBytes" -}}
{{- $file := printf "files/%s" .Values.plugin.wheel.file -}}
{{- $bytes := .Files.Get $file -}}
{{- if not $bytes -}}
{{- fail (printf "plugin.source is bundled but the chart has no %s: render the chart again with deploykit" $file) -}}
{{- end -}}
{{- if ne (sha256sum $bytes) .Values.plugin.wheel.sha256 -}}
{{- fail (printf "%s does not match plugin.wheel.sha256 %s: render the chart again with deploykit" $file .Values.plugin.wheel.sha256) -}}
{{- end -}}
{{- $bytes -}}
{{- end -}}

{{/* What rolls the pods when the plugin changes: the wheel's digest, or what names the plugin elsewhere. */}}
{{- define "deploykit.pluginIdentity" -}}
{{- $source := .Values.plugin.source -}}
{{- if eq $source "bundled" -}}sha256:{{ .Values.plugin.wheel.sha256 }}
{{- else if eq $source "url" -}}sha256:{{ .Values.plugin.url.sha256 }}
{{- else if eq $source "index" -}}{{ .Values.plugin.index.requirement }}
{{- else -}}image:{{ include "deploykit.vllmImage" . }}
{{- end -}}
{{- end -}}

{{/* PYTHONPATH for deploykit: the wheel itself (Python imports from a zip, and importlib.metadata reads its
entry points), or the folder an init container installed into; nothing for a derived image. */}}
{{- define "deploykit.pythonPath" -}}
{{- $source := .Values.plugin.source -}}
{{- if eq $source "bundled" -}}{{ .Values.plugin.path }}/{{ .Values.plugin.wheel.file }}
{{- else if or (eq $source "index") (eq $source "url") -}}{{ .Values.plugin.path }}
{{- end -}}
{{- end -}}

{{- define "deploykit.pluginEnv" -}}
{{- with include "deploykit.pythonPath" . -}}
- name: PYTHONPATH
  value: {{ . | quote }}
{{- end -}}
{{- end -}}

{{- define "deploykit.pluginMount" -}}
{{- if ne .Values.plugin.source "image" -}}
- name: deploykit-plugin
  mountPath: {{ .Values.plugin.path }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "deploykit.pluginVolume" -}}
{{- if eq .Values.plugin.source "bundled" -}}
- name: deploykit-plugin
  configMap:
    name: {{ .Release.Name }}-plugin
    items:
      - key: {{ .Values.plugin.wheel.file }}
        path: {{ .Values.plugin.wheel.file }}
{{- else if ne .Values.plugin.source "image" }}
- name: deploykit-plugin
  emptyDir: {}
{{- end }}
{{- end -}}

{{/* index / url: an init container of the vLLM image installs the plugin alone (--no-deps: the image has
what it needs) into the emptyDir. The index URL, credentials and all, comes from a Secret, never a value. */}}
{{- define "deploykit.pluginInstall" -}}
{{- $source := .Values.plugin.source -}}
{{- if or (eq $source "index") (eq $source "url") -}}
- name: deploykit-plugin
  image: {{ include "deploykit.vllmImage" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if eq $source "index" }}
  command:
    - python3
    - -m
    - pip
    - install
    - --no-deps
    - --no-cache-dir
    - --disable-pip-version-check
    - --target
    - {{ .Values.plugin.path | quote }}
    - {{ .Values.plugin.index.requirement | quote }}
  {{- else }}
  command:
    - sh
    - -c
    - >-
      printf '%s --hash=sha256:%s\n' "$DEPLOYKIT_WHEEL_URL" "$DEPLOYKIT_WHEEL_SHA256" > /tmp/deploykit.txt &&
      exec python3 -m pip install --no-deps --no-cache-dir --disable-pip-version-check --require-hashes
      --target "$DEPLOYKIT_TARGET" -r /tmp/deploykit.txt
  {{- end }}
  env:
    - name: HOME
      value: /tmp
    - name: DEPLOYKIT_TARGET
      value: {{ .Values.plugin.path | quote }}
    {{- if eq $source "index" }}
    - name: PIP_INDEX_URL
      valueFrom:
        secretKeyRef:
          name: {{ .Values.plugin.index.secretName }}
          key: {{ .Values.plugin.index.secretKey }}
    {{- else }}
    - name: DEPLOYKIT_WHEEL_URL
      value: {{ .Values.plugin.url.url | quote }}
    - name: DEPLOYKIT_WHEEL_SHA256
      value: {{ .Values.plugin.url.sha256 | quote }}
    {{- end }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: deploykit-plugin
      mountPath: {{ .Values.plugin.path }}
{{- end }}
{{- end -}}

{{/* The user's affinity, with the GPU node-selector terms the facts give ANDed into its required node
affinity (Kubernetes ORs terms, so each user term is combined with each GPU term). */}}
{{- define "deploykit.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) -}}
{{- $gpuTerms := .Values.gpuNodeSelectorTerms | default list -}}
{{- if $gpuTerms -}}
{{- $node := get $affinity "nodeAffinity" | default dict -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $userTerms := get $required "nodeSelectorTerms" | default list -}}
{{- $terms := list -}}
{{- if $userTerms -}}
{{- range $user := $userTerms -}}
{{- range $gpu := $gpuTerms -}}
{{- $term := dict "matchExpressions" (concat ($user.matchExpressions | default list) ($gpu.matchExpressions | default list)) -}}
{{- if $user.matchFields -}}{{- $_ := set $term "matchFields" $user.matchFields -}}{{- end -}}
{{- $terms = append $terms $term -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- $terms = $gpuTerms -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $terms -}}
{{- $_ := set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ := set $affinity "nodeAffinity" $node -}}
{{- end -}}
{{- if $affinity -}}{{ toYaml $affinity }}{{- end -}}
{{- end -}}

{{/* vLLM's readiness or liveness with the canary on: an exec probe in the vLLM container that asks vLLM's
/health and reads the canary's verdict file (deploykit/render/pod_probe.py). */}}
{{- define "deploykit.verdictProbe" -}}
{{- $root := index . 0 -}}
{{- $mode := index . 1 -}}
exec:
  command:
    - python3
    - -m
    - deploykit.render.pod_probe
    - {{ $mode }}
    - --health-url
    - "http://127.0.0.1:{{ $root.Values.port }}/health"
    - --verdict-file
    - /run/deploykit/verdict.json
    - --timeout
    - "5"
    - --max-verdict-age
    - {{ $root.Values.canary.verdictMaxAgeSeconds | quote }}
    # Corruption restarts counted in the pod's own emptyDir and capped (3 an hour, as systemd's).
    - --ledger-dir
    - /run/deploykit-ledger
{{- end -}}
