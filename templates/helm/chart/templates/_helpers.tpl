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
helm.sh/chart: {{ include "deploykit.chartLabel" . }}
{{- end -}}

{{- define "deploykit.labels" -}}
{{ include "deploykit.selectorLabels" . }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "deploykit.chartLabel" . }}
{{- end -}}

{{/* The chart and its version as a label value: the version's build metadata (`+<digest>`,
deploykit.render.helm.chart_version) as `_`, as helm writes it in an OCI tag; at most 63 characters, ending
alphanumeric. Never in a pod template: a new chart version alone rolls no pod (docs/deploy.md, GitOps). */}}
{{- define "deploykit.chartLabel" -}}
{{- $label := printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 -}}
{{- regexReplaceAll "[-._]+$" $label "" -}}
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
{{- if eq .Values.gpuNodeSelection "none" -}}
{{- include "deploykit.checkOwnPlacement" . -}}
{{- $gpuTerms = list -}}
{{- end -}}
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

{{/* gpuNodeSelection none drops the GPU Feature Discovery terms: the user's nodeSelector or required node
affinity must then keep the pod on the GPU the chart was rendered for, or it lands on any GPU node (and its
fixes were decided for another compute capability). A chart without GPU terms (a CPU plan) has nothing to keep. */}}
{{- define "deploykit.checkOwnPlacement" -}}
{{- $required := dig "nodeAffinity" "requiredDuringSchedulingIgnoredDuringExecution" "nodeSelectorTerms" list (.Values.affinity | default dict) -}}
{{- if and .Values.gpuNodeSelectorTerms (not .Values.nodeSelector) (not $required) -}}
{{- fail "gpuNodeSelection none: set nodeSelector or a required node affinity (affinity.nodeAffinity) that picks only nodes with the GPU this chart was rendered for; without GPU Feature Discovery's labels nothing else keeps the pod off other GPUs" -}}
{{- end -}}
{{- end -}}

{{/* topologySpreadConstraints as given; an item without labelSelector gets the release's selector labels (a
constraint whose selector matches no pod spreads nothing). */}}
{{- define "deploykit.topologySpread" -}}
{{- $root := . -}}
{{- $constraints := list -}}
{{- range .Values.topologySpreadConstraints -}}
{{- $constraint := deepCopy . -}}
{{- if not (hasKey $constraint "labelSelector") -}}
{{- $_ := set $constraint "labelSelector" (dict "matchLabels" (include "deploykit.selectorLabels" $root | fromYaml)) -}}
{{- end -}}
{{- $constraints = append $constraints $constraint -}}
{{- end -}}
{{- with $constraints }}{{ toYaml . }}{{ end -}}
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
Secret; the names travel as environment variables, never through a shell. Its program
(files/model_download.py: deploykit.render.model_download, run by the image's python) exits non-zero unless
every file of the commit is there at its size: without the hub, only a complete earlier download passes, so
vLLM never starts on a partial snapshot. */}}
{{- define "deploykit.modelDownload" -}}
{{- $root := . -}}
{{- range .Values.model.volumes }}
{{- if .download }}
{{- $program := $root.Files.Get "files/model_download.py" }}
{{- if not $program }}
{{- fail "files/model_download.py is missing from the chart: render it again with deploykit render helm" }}
{{- end }}
- name: {{ printf "download-%s" .name | quote }}
  image: {{ include "deploykit.vllmImage" $root | quote }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy | quote }}
  command:
    - python3
    - -c
    - {{ $program | toJson }}
  env:
    - name: NVIDIA_VISIBLE_DEVICES
      value: void
    - name: HF_HUB_DISABLE_PROGRESS_BARS
      value: "1"
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

{{/* The Deployment's update strategy, decided by replicaCount at install time (docs/deploy.md, Replicas). More
than one replica: a rolling update, rollout.maxUnavailable pods at a time with rollout.maxSurge extra (0 by
default: a surge needs a spare GPU). One replica or none: Recreate, since the old pod's GPUs are not free for
its successor; with a surge, the new pod comes up before the old one goes (maxUnavailable 0). */}}
{{- define "deploykit.strategy" -}}
{{- $surge := int .Values.rollout.maxSurge -}}
{{- if gt (int .Values.replicaCount) 1 -}}
type: RollingUpdate
rollingUpdate:
  maxSurge: {{ $surge }}
  maxUnavailable: {{ int .Values.rollout.maxUnavailable }}
{{- else if gt $surge 0 -}}
type: RollingUpdate
rollingUpdate:
  maxSurge: {{ $surge }}
  maxUnavailable: 0
{{- else -}}
type: Recreate
{{- end -}}
{{- end -}}

{{/* The PodDisruptionBudget's maxUnavailable: a drain takes as many pods at a time as a rollout does, and never
0, which would block every node drain forever. One replica or none: 1 (a drain may take the only pod, as a
rollout without a surge does); a budget cannot keep one pod serving, it could only stop the drain. */}}
{{- define "deploykit.disruptionBudget" -}}
{{- if gt (int .Values.replicaCount) 1 -}}
{{ max 1 (int .Values.rollout.maxUnavailable) }}
{{- else -}}
1
{{- end -}}
{{- end -}}

{{/* A group's LeaderWorkerSet: not the release's own name, which its Service (the API) has, because the LWS
controller makes a headless Service named after the set for its pods' DNS names (LWS_LEADER_ADDRESS is
`<set>-<group>.<set>.<namespace>`). Its StatefulSets' revision labels (`<set>-<group>-<10-character hash>`)
must stay within 63 characters: a longer release name fails here rather than in the controller. */}}
{{- define "deploykit.groupName" -}}
{{- $name := printf "%s-group" .Release.Name -}}
{{- if gt (len $name) 49 -}}
{{- fail (printf "release name %s: a multi-node group's LeaderWorkerSet %s would make names over 63 characters; use a release name of at most 43" .Release.Name $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* The group's commands were planned for deploy.nodes nodes (`--nnodes`); a group.size that says otherwise
would start pods that never form a world, so the chart refuses it. */}}
{{- define "deploykit.checkGroup" -}}
{{- $command := .Values.group.leaderCommand -}}
{{- $nodes := "" -}}
{{- range $index, $word := $command -}}
{{- if and (eq $word "--nnodes") (lt (add1 $index) (len $command)) -}}{{- $nodes = index $command (add1 $index) -}}{{- end -}}
{{- end -}}
{{- if ne $nodes (toString .Values.group.size) -}}
{{- fail (printf "group.size %v: the group's commands were planned for --nnodes %s; change deploy.nodes in the profile and render the chart again" .Values.group.size $nodes) -}}
{{- end -}}
{{- end -}}

{{/* How a group's rollout replaces groups: the Deployment's decision (deploykit.strategy), in the
LeaderWorkerSet's terms. A group is one unit: maxUnavailable groups at a time, maxSurge extra groups. Where the
Deployment would Recreate (one replica, no surge) the set has no such type: maxUnavailable 1, maxSurge 0 deletes
the group before its successor is made, which is what Recreate does. */}}
{{- define "deploykit.groupRollout" -}}
{{- $strategy := include "deploykit.strategy" . | fromYaml -}}
{{- with $strategy.rollingUpdate -}}
maxSurge: {{ int .maxSurge }}
maxUnavailable: {{ int .maxUnavailable }}
{{- else -}}
maxSurge: 0
maxUnavailable: 1
{{- end -}}
{{- end -}}

{{/* A group's worker waits for its leader before vLLM starts. LeaderWorkerSet creates a group's pods together,
and the leader's address resolves only once its pod has one; a worker whose vLLM asked for the rendezvous too
early would fail, and RecreateGroupOnPodRestart would recreate the whole group, again and again while the
leader's image is pulled. So an init container connects to the leader's rendezvous port until it answers, for
at most group.leaderWaitSeconds; past that it fails, and the group is recreated. Standard library only: it
needs nothing of deploykit's. The address arrives as an argument, expanded by the kubelet. */}}
{{- define "deploykit.waitForLeader" -}}
- name: wait-for-leader
  image: {{ include "deploykit.vllmImage" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy | quote }}
  command:
    - python3
    - -c
    - |-
      import socket, sys, time
      host, port, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
      start, last = time.monotonic(), "not tried"
      while True:
          try:
              socket.create_connection((host, port), timeout=5).close()
          except OSError as error:
              last = str(error)
          else:
              print(f"the leader's rendezvous {host}:{port} answers after {time.monotonic() - start:.0f} s")
              sys.exit(0)
          if time.monotonic() - start >= limit:
              sys.exit(f"the leader's rendezvous {host}:{port} did not answer within {limit:.0f} s ({last})")
          time.sleep(2)
    - "$(LWS_LEADER_ADDRESS)"
    - {{ .Values.group.masterPort | quote }}
    - {{ .Values.group.leaderWaitSeconds | quote }}
  env:
    # A TCP client: no GPU, whatever the image's NVIDIA_VISIBLE_DEVICES says.
    - name: NVIDIA_VISIBLE_DEVICES
      value: void
  resources:
    requests:
      cpu: 10m
      memory: 32Mi
    limits:
      memory: 128Mi
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
{{- end -}}
