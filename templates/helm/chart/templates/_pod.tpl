{{/* The vLLM pod, written once for every pod that runs it: the Deployment's ("server"), and a multi-node
group's leader ("leader": the API server, the probes and the canary) and workers ("worker": engine ranks only,
no API, no probes, no canary; they wait for the leader's rendezvous before vLLM starts). Called with
(dict "root" . "role" ROLE); everything else (the plugin, the fixes' environment, /dev/shm, the model volumes,
the GPU node affinity) is the same for all three, so a group's pods get exactly what a single pod gets. */}}
{{- define "deploykit.podSpec" -}}
{{- $root := .root -}}
{{- $role := .role -}}
{{- $serves := ne $role "worker" -}}
{{- $canary := and $serves $root.Values.canary.enabled -}}
{{- include "deploykit.checkModelPaths" $root -}}
# No {SERVICE}_PORT variables from the kubelet: a release named `vllm` would hand vLLM
# VLLM_PORT=tcp://..., which it refuses.
enableServiceLinks: {{ $root.Values.enableServiceLinks }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.serviceAccountName }}
serviceAccountName: {{ . | quote }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- with $root.Values.runtimeClassName }}
runtimeClassName: {{ . | quote }}
{{- end }}
{{- if not (kindIs "invalid" $root.Values.terminationGracePeriodSeconds) }}
terminationGracePeriodSeconds: {{ int64 $root.Values.terminationGracePeriodSeconds }}
{{- end }}
{{- with $root.Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with include "deploykit.affinity" $root }}
affinity:
  {{- . | nindent 2 }}
{{- end }}
{{- with concat $root.Values.gpuTolerations $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with include "deploykit.topologySpread" $root }}
topologySpreadConstraints:
  {{- . | nindent 2 }}
{{- end }}
{{- $init := printf "%s\n%s" (include "deploykit.pluginInstall" $root) (include "deploykit.modelDownload" $root) | trim }}
{{- $wait := "" }}
{{- if eq $role "worker" }}{{ $wait = include "deploykit.waitForLeader" $root }}{{ end }}
{{- if or $init $root.Values.initContainers $wait }}
initContainers:
  {{- with $init }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- with $root.Values.initContainers }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- with $wait }}
  {{- . | nindent 2 }}
  {{- end }}
{{- end }}
containers:
  - name: vllm
    image: {{ include "deploykit.vllmImage" $root | quote }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy | quote }}
    command:
      {{- if eq $role "leader" }}
      {{- toYaml $root.Values.group.leaderCommand | nindent 6 }}
      {{- else if eq $role "worker" }}
      {{- toYaml $root.Values.group.workerCommand | nindent 6 }}
      {{- else }}
      {{- toYaml $root.Values.command | nindent 6 }}
      {{- end }}
    env:
      {{- with include "deploykit.pythonPathEnv" (list $root (get $root.Values.env "PYTHONPATH")) }}
      {{- . | nindent 6 }}
      {{- end }}
      # Run non-root: a writable HOME (an emptyDir) and caches on the cache volume.
      - name: HOME
        value: {{ $root.Values.home.path | quote }}
      - name: XDG_CACHE_HOME
        value: {{ $root.Values.cache.path | quote }}
      {{- range $name, $value := $root.Values.env }}
      {{- if ne $name "PYTHONPATH" }}
      - name: {{ $name | quote }}
        value: {{ $value | toString | quote }}
      {{- end }}
      {{- end }}
      {{- if ne $role "server" }}
      {{- range $name, $value := $root.Values.group.fabricEnv }}
      {{- if hasKey $root.Values.env $name }}
      {{- fail (printf "group.fabricEnv.%s: env sets %s too; set it in one place" $name $name) }}
      {{- end }}
      - name: {{ $name | quote }}
        value: {{ $value | toString | quote }}
      {{- end }}
      {{- end }}
      {{- if $root.Values.model.offline }}
      # Every model and adapter path is local: nothing is asked of the hub.
      {{- range $name := list "HF_HUB_OFFLINE" "TRANSFORMERS_OFFLINE" }}
      {{- if not (hasKey $root.Values.env $name) }}
      - name: {{ $name }}
        value: "1"
      {{- end }}
      {{- end }}
      {{- end }}
      {{- range $name, $key := $root.Values.secretEnv }}
      - name: {{ $name | quote }}
        valueFrom:
          secretKeyRef:
            name: {{ $root.Values.secretName | quote }}
            key: {{ $key | quote }}
      {{- end }}
      {{- with $root.Values.extraEnv }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- with $root.Values.envFrom }}
    # Whole ConfigMaps and Secrets as variables; a variable set in env above wins over one of the same name.
    envFrom:
      {{- toYaml . | nindent 6 }}
    {{- end }}
    {{- if $serves }}
    ports:
      - name: http
        containerPort: {{ $root.Values.port }}
        protocol: TCP
      {{- if eq $role "leader" }}
      # The group's rendezvous (torch.distributed's store): the workers connect to it pod to pod.
      - name: rendezvous
        containerPort: {{ int $root.Values.group.masterPort }}
        protocol: TCP
      {{- end }}
    startupProbe:
      {{- toYaml $root.Values.probes.startup | nindent 6 }}
    {{- if $canary }}
    # vLLM's /health plus the canary's verdict file, asked inside this container (docs/deploy.md has
    # the failure table): a canary that is missing or stuck leaves no fresh verdict and changes
    # nothing; a fresh "corrupt" or "hung" fails both probes, "unreachable" or "unknown" (a canary
    # that stopped or crashed) only readiness. Both wait
    # for the startup probe above, so a long model load never trips them.
    readinessProbe:
      {{- include "deploykit.verdictProbe" (list $root "ready") | nindent 6 }}
      {{- toYaml $root.Values.canary.readiness | nindent 6 }}
    livenessProbe:
      {{- include "deploykit.verdictProbe" (list $root "live") | nindent 6 }}
      {{- toYaml $root.Values.canary.liveness | nindent 6 }}
    {{- else }}
    readinessProbe:
      {{- toYaml $root.Values.probes.readiness | nindent 6 }}
    livenessProbe:
      {{- toYaml $root.Values.probes.liveness | nindent 6 }}
    {{- end }}
    {{- else }}
    # A headless rank: nothing listens on the API port, so no HTTP probe. Its process ending ends this
    # container, and a restart recreates the whole group (RecreateGroupOnPodRestart); a rank that hangs
    # stalls the leader's engine, which the leader's canary reports as hung.
    {{- end }}
    resources:
      {{- toYaml $root.Values.resources | nindent 6 }}
    securityContext:
      {{- toYaml $root.Values.securityContext | nindent 6 }}
    volumeMounts:
      - name: cache
        mountPath: {{ $root.Values.cache.path | quote }}
      - name: home
        mountPath: {{ $root.Values.home.path | quote }}
      {{- range $root.Values.model.volumes }}
      - name: {{ .name | quote }}
        mountPath: {{ .mountPath | quote }}
        {{- with .subPath }}
        subPath: {{ . | quote }}
        {{- end }}
        readOnly: true
      {{- end }}
      {{- with $root.Values.extraVolumeMounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
      {{- with include "deploykit.pluginMount" $root }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- if $canary }}
      - name: canary-verdict
        mountPath: /run/deploykit
        readOnly: true
      # The liveness probe's restart ledger: outlives this container, not the pod.
      - name: canary-ledger
        mountPath: /run/deploykit-ledger
      {{- end }}
      {{- if $root.Values.shm.enabled }}
      - name: dshm
        mountPath: /dev/shm
      {{- end }}
  {{- if $canary }}
  {{- if lt (float64 $root.Values.canary.verdictMaxAgeSeconds) (mulf 2 (float64 $root.Values.canary.every)) }}
  {{- fail (printf "canary.every %v: a verdict older than canary.verdictMaxAgeSeconds (%v s) is ignored, and the canary rewrites it once per run: every must be at most half of it (raise canary.verdictMaxAgeSeconds with it)" $root.Values.canary.every $root.Values.canary.verdictMaxAgeSeconds) }}
  {{- end }}
  {{- include "deploykit.canaryContainer" $root | nindent 2 }}
  {{- end }}
volumes:
  {{- with include "deploykit.pluginVolume" $root }}
  {{- . | nindent 2 }}
  {{- end }}
  {{- range $root.Values.model.volumes }}
  - name: {{ .name | quote }}
    {{- toYaml .source | nindent 4 }}
  {{- end }}
  {{- with $root.Values.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  {{- if $canary }}
  - name: canary-profile
    configMap:
      name: {{ $root.Release.Name }}-profile
  - name: canary-scratch
    emptyDir: {}
  - name: canary-verdict
    emptyDir: {}
  - name: canary-ledger
    emptyDir: {}
  {{- range $name, $key := $root.Values.smokeTest.secretEnv }}
  - name: canary-key
    secret:
      secretName: {{ $root.Values.secretName | quote }}
      items:
        - key: {{ $key | quote }}
          path: api-key
  {{- end }}
  {{- end }}
  - name: home
    emptyDir: {}
  - name: cache
    {{- with include "deploykit.cacheClaim" $root }}
    persistentVolumeClaim:
      claimName: {{ . | quote }}
    {{- else }}
    # Sized: a hub model filling it evicts this pod, never the node's other pods.
    emptyDir:
      sizeLimit: {{ $root.Values.cache.sizeLimit | quote }}
    {{- end }}
  {{- if $root.Values.shm.enabled }}
  - name: dshm
    emptyDir:
      medium: Memory
      sizeLimit: {{ $root.Values.shm.sizeLimit | quote }}
  {{- end }}
{{- end -}}

{{/* The claim the cache volume mounts (HF_HOME, VLLM_CACHE_ROOT: a hub model lands there), or "" for a sized
emptyDir. cache.existingClaim: yours. cache.persistence.enabled true: the chart's (templates/pvc-cache.yaml);
auto (the default when the model or an adapter comes from the hub): the chart's when the release is one pod
(one replica, no surge, no group), so a restarted or upgraded pod finds the model where the last one left it;
more pods than one on a ReadWriteOnce claim would wait for each other across nodes, so each gets its own
emptyDir instead. A group on the chart's claim needs ReadWriteMany: its pods are on different nodes. */}}
{{- define "deploykit.cacheClaim" -}}
{{- $persistence := .Values.cache.persistence -}}
{{- $enabled := toString $persistence.enabled -}}
{{- $onePod := and (not .Values.group) (le (int .Values.replicaCount) 1) (eq (int .Values.rollout.maxSurge) 0) -}}
{{- if .Values.cache.existingClaim -}}
{{ .Values.cache.existingClaim }}
{{- else if eq $enabled "true" -}}
{{- if and .Values.group (not (has "ReadWriteMany" $persistence.accessModes)) -}}
{{- fail "cache.persistence.enabled: a group's pods run on different nodes and cannot share a ReadWriteOnce claim: set cache.persistence.accessModes={ReadWriteMany} (a storage class that offers it), or cache.persistence.enabled=auto for an emptyDir per pod" -}}
{{- end -}}
{{ .Release.Name }}-cache
{{- else if and (eq $enabled "auto") $onePod -}}
{{ .Release.Name }}-cache
{{- end -}}
{{- end -}}

{{/* deploykit canary: a cheap rotation of smoke cases against vLLM every canary.every seconds, its verdict
written to /run/deploykit/verdict.json for vLLM's probes. Same image as vLLM. In the pod that serves the API
(the Deployment's, a group's leader). */}}
{{- define "deploykit.canaryContainer" -}}
# deploykit canary: a cheap rotation of smoke cases against vLLM every canary.every seconds, its
# verdict written to /run/deploykit/verdict.json for vLLM's probes. Same image as vLLM.
- name: canary
  image: {{ include "deploykit.canaryImage" . | quote }}
  imagePullPolicy: {{ .Values.canary.pullPolicy | quote }}
  # Through its keeper (deploykit.render.canary_keeper), this container's first process: a canary that
  # crashes, or stays silent for verdictMaxAgeSeconds (hung), is restarted inside the container, which
  # itself never exits on the canary's account. A container that restarts goes into CrashLoopBackOff,
  # and a pod with a container not running is not Ready: the Service would drop a healthy vLLM.
  command:
    - python3
    - -m
    - deploykit.render.canary_keeper
    - --verdict-file
    - /run/deploykit/verdict.json
    - --max-verdict-age
    - {{ .Values.canary.verdictMaxAgeSeconds | quote }}
    - --
    - python3
    - -m
    - deploykit
    - canary
    - --url
    - "http://127.0.0.1:{{ .Values.port }}"
    - --profile
    - /etc/deploykit/profile.yaml
    - --listen
    - "0.0.0.0:{{ .Values.canary.port }}"
    - --every
    - {{ .Values.canary.every | quote }}
    - --miss-limit
    - {{ .Values.canary.missLimit | quote }}
    - --verdict-file
    - /run/deploykit/verdict.json
    # Rows would live in this pod's scratch volume and die with it; the verdict and /metrics are
    # what the cluster reads.
    - --no-store
    # Never exit on its own trouble (a refused key, a name not served, a profile it cannot read):
    # a `misconfigured` verdict the probes ignore, tried again every run. An exiting sidecar
    # crash-loops and takes the pod out of the Service.
    - --keep-running
    {{- range .Values.canary.knownHangs }}
    # A hang advisory the plan matched: a `hung` verdict names it (deploykit advisories ID).
    - --known-hang
    - {{ . | quote }}
    {{- end }}
    {{- if .Values.smokeTest.secretEnv }}
    # The key from the mounted Secret, read again before every run: a rotated key is picked up.
    - --api-key-file
    - /etc/deploykit-key/api-key
    {{- end }}
  # No livenessProbe: the keeper restarts a hung canary itself; a probe could only restart this
  # container, which is what takes the pod out of the Service.
  ports:
    - name: canary
      containerPort: {{ .Values.canary.port }}
      protocol: TCP
  env:
    {{- with include "deploykit.pythonPathEnv" (list . "") }}
    {{- . | nindent 4 }}
    {{- end }}
    # No GPU for the canary, whatever the image's NVIDIA_VISIBLE_DEVICES says.
    - name: NVIDIA_VISIBLE_DEVICES
      value: void
    - name: HOME
      value: /scratch
    - name: XDG_DATA_HOME
      value: /scratch
    {{- range $name, $key := .Values.smokeTest.secretEnv }}
    - name: {{ $name | quote }}
      valueFrom:
        secretKeyRef:
          name: {{ $.Values.secretName | quote }}
          key: {{ $key | quote }}
    {{- end }}
  resources:
    {{- toYaml .Values.canary.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.canary.securityContext | nindent 4 }}
  volumeMounts:
    - name: canary-profile
      mountPath: /etc/deploykit
      readOnly: true
    - name: canary-scratch
      mountPath: /scratch
    - name: canary-verdict
      mountPath: /run/deploykit
    {{- if .Values.smokeTest.secretEnv }}
    - name: canary-key
      mountPath: /etc/deploykit-key
      readOnly: true
    {{- end }}
    {{- with include "deploykit.pluginMount" . }}
    {{- . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* The pod template's metadata, the same for the Deployment's pod and a group's leader and workers
(the role, when not "server", is its app.kubernetes.io/component). A new plugin or profile rolls the pods. */}}
{{- define "deploykit.podMetadata" -}}
{{- $root := .root -}}
labels:
  {{- include "deploykit.selectorLabels" $root | nindent 2 }}
  {{- if ne .role "server" }}
  app.kubernetes.io/component: {{ .role }}
  {{- end }}
  {{- with $root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  # A new plugin (or profile) rolls the pods.
  deploykit.io/plugin: {{ include "deploykit.pluginIdentity" $root | quote }}
  deploykit.io/profile-id: {{ $root.Values.deploykit.profileId | quote }}
  {{- with $root.Values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* The annotations of the object that runs the pods (the Deployment, a group's LeaderWorkerSet). */}}
{{- define "deploykit.objectAnnotations" -}}
deploykit.io/profile: {{ .Values.deploykit.profile | quote }}
deploykit.io/profile-id: {{ .Values.deploykit.profileId | quote }}
deploykit.io/vllm-version: {{ .Values.deploykit.vllmVersion | quote }}
{{- with .Values.deploykit.advisories }}
deploykit.io/advisories: {{ . | quote }}
{{- end }}
{{- end -}}
