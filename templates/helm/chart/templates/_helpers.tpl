{{/* Labels every object carries; the selector is the stable subset. */}}
{{- define "deploykit.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The `helm test` pod's: never the selector's pair, so the Service, the PDB and the monitors leave it out. */}}
{{- define "deploykit.testLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-smoke-test
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: smoke-test
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
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

{{/* PYTHONPATH: the plugin's, joined with one of the user's (index 1 of the list: the profile's or env's;
"" for none), never replaced by it: Kubernetes keeps the last of two entries of one name, and a vLLM without
the plugin runs without the fixes (and the exec probes fail). */}}
{{- define "deploykit.pythonPathEnv" -}}
{{- $root := index . 0 -}}
{{- $parts := list -}}
{{- with include "deploykit.pythonPath" $root -}}{{- $parts = append $parts . -}}{{- end -}}
{{- with index . 1 -}}{{- $parts = append $parts (toString .) -}}{{- end -}}
{{- with $parts -}}
- name: PYTHONPATH
  value: {{ join ":" . | quote }}
{{- end -}}
{{- end -}}

{{- define "deploykit.pluginMount" -}}
{{- if ne .Values.plugin.source "image" -}}
- name: deploykit-plugin
  mountPath: {{ .Values.plugin.path | quote }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* The bundled wheel's ConfigMap: named by the wheel's digest, so one name always holds the same bytes. */}}
{{- define "deploykit.pluginConfigMap" -}}
{{ .Release.Name }}-plugin-{{ .Values.plugin.wheel.sha256 | trunc 12 }}
{{- end -}}

{{- define "deploykit.pluginVolume" -}}
{{- if eq .Values.plugin.source "bundled" -}}
- name: deploykit-plugin
  configMap:
    name: {{ include "deploykit.pluginConfigMap" . }}
    items:
      - key: {{ .Values.plugin.wheel.file | quote }}
        path: {{ .Values.plugin.wheel.file | quote }}
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
  imagePullPolicy: {{ .Values.image.pullPolicy | quote }}
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
          name: {{ .Values.plugin.index.secretName | quote }}
          key: {{ .Values.plugin.index.secretKey | quote }}
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
      mountPath: {{ .Values.plugin.path | quote }}
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

{{/* Every local model or adapter path vLLM opens at start-up must lie under a mount of the vLLM container:
one of model.volumes or extraVolumeMounts. Otherwise vLLM crash-loops, so the chart refuses to render. */}}
{{- define "deploykit.checkModelPaths" -}}
{{- $mounts := list -}}
{{- range .Values.model.volumes }}{{- $mounts = append $mounts .mountPath -}}{{- end -}}
{{- range .Values.extraVolumeMounts }}{{- $mounts = append $mounts .mountPath -}}{{- end -}}
{{- range $path := .Values.model.paths -}}
{{- $held := false -}}
{{- range $mount := $mounts -}}
{{- $dir := trimSuffix "/" $mount -}}
{{- if or (eq $path $dir) (hasPrefix (printf "%s/" $dir) $path) -}}{{- $held = true -}}{{- end -}}
{{- end -}}
{{- if not $held -}}
{{- fail (printf "model path %s: no volume in model.volumes or extraVolumeMounts is mounted over it, so vLLM would not find it in the pod" $path) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A `download` model volume: an init container of the vLLM image fetches the repository into it from the
hub (clusters with egress only; never by default). The token, when the release has one, comes from the
Secret; the names travel as environment variables, never through a shell. */}}
{{- define "deploykit.modelDownload" -}}
{{- $root := . -}}
{{- range .Values.model.volumes }}
{{- if .download }}
- name: {{ printf "download-%s" .name | quote }}
  image: {{ include "deploykit.vllmImage" $root | quote }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy | quote }}
  command:
    - python3
    - -c
    - >-
      import os; from huggingface_hub import snapshot_download;
      snapshot_download(repo_id=os.environ["DEPLOYKIT_MODEL_REPO"],
      revision=os.environ["DEPLOYKIT_MODEL_REVISION"] or None, local_dir=os.environ["DEPLOYKIT_MODEL_DIR"])
  env:
    - name: NVIDIA_VISIBLE_DEVICES
      value: void
    - name: HOME
      value: /tmp
    - name: HF_HOME
      value: /tmp/huggingface
    - name: DEPLOYKIT_MODEL_REPO
      value: {{ .download.repo | quote }}
    - name: DEPLOYKIT_MODEL_REVISION
      value: {{ .download.revision | default "" | quote }}
    - name: DEPLOYKIT_MODEL_DIR
      value: {{ .mountPath | quote }}
    {{- if hasKey $root.Values.secretEnv "HF_TOKEN" }}
    - name: HF_TOKEN
      valueFrom:
        secretKeyRef:
          name: {{ $root.Values.secretName | quote }}
          key: {{ get $root.Values.secretEnv "HF_TOKEN" | quote }}
    {{- end }}
  securityContext:
    {{- toYaml $root.Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: {{ .name | quote }}
      mountPath: {{ .mountPath | quote }}
      {{- with .subPath }}
      subPath: {{ . | quote }}
      {{- end }}
{{- end }}
{{- end }}
{{- end -}}
