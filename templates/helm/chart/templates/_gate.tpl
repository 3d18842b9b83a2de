{{/* The upgrade gate (values `gate`; docs/deploy.md, The upgrade gate in a cluster and on a host): `deploykit
gate` judging a candidate server against the baseline, in the pod the `helm test` hook runs `deploykit smoke`
in (the image, the plugin, the security context, the placement, the API key), with the profile and the facts
the chart was rendered from. One pod, written once for the AnalysisTemplate and the Job. */}}

{{/* The gate's objects and pod: never the selector's pair, so the Service, the PDB and the monitors leave
them out. */}}
{{- define "deploykit.gateLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-gate
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: gate
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "deploykit.chartLabel" . }}
{{- end -}}

{{/* A word for a container's command or args: Kubernetes expands $(NAME) there and reduces $$ to $, so
every $ is doubled and the container sees the value as given (deploykit.render.helm.kubernetes_literal). */}}
{{- define "deploykit.commandWord" -}}
{{- toString . | replace "$" "$$" -}}
{{- end -}}

{{/* The candidate and the baseline: gate.candidateUrl and gate.baselineUrl, else the Argo canary Service
<release>-canary and the stable one, the chart's own Service <release>. */}}
{{- define "deploykit.gateCandidateUrl" -}}
{{- .Values.gate.candidateUrl | default (printf "http://%s-canary:%s" .Release.Name (toString .Values.service.port)) -}}
{{- end -}}

{{- define "deploykit.gateBaselineUrl" -}}
{{- .Values.gate.baselineUrl | default (printf "http://%s:%s" .Release.Name (toString .Values.service.port)) -}}
{{- end -}}

{{/* The facts the chart was rendered from (`deploykit probe --save`): the gate's --facts. */}}
{{- define "deploykit.gateFacts" -}}
{{- $facts := .Files.Get "files/probe-facts.json" -}}
{{- if not $facts -}}
{{- fail "gate: the chart has no files/probe-facts.json: render the chart again with deploykit" -}}
{{- end -}}
{{- $facts -}}
{{- end -}}

{{/* The gate's pod spec. Called with (dict "root" . "candidate" URL "baseline" URL): the URLs as the
command takes them (escaped with deploykit.commandWord, or the AnalysisTemplate's args placeholders). */}}
{{- define "deploykit.gatePod" -}}
{{- $root := .root -}}
{{- $gate := $root.Values.gate -}}
restartPolicy: Never
enableServiceLinks: {{ $root.Values.enableServiceLinks }}
{{- with $root.Values.smokeTest.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with concat $root.Values.gpuTolerations $root.Values.smokeTest.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
  {{- with $root.Values.smokeTest.affinity }}
  {{- toYaml . | nindent 2 }}
  {{- else }}
  # Where a server pod runs, if it can: that node has already pulled the (large) vLLM image.
  podAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "deploykit.selectorLabels" $root | nindent 14 }}
  {{- end }}
{{- with $root.Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.serviceAccountName }}
serviceAccountName: {{ . | quote }}
{{- end }}
initContainers:
  {{- with include "deploykit.pluginInstall" $root }}
  {{- . | nindent 2 }}
  {{- end }}
  # The gate judges two servers that answer: it waits for each one's /health (a candidate installed with this
  # release loads its model first), gate.waitSeconds at most for both. Standard library only; the URLs are
  # arguments, never shell text.
  - name: wait-for-servers
    image: {{ include "deploykit.smokeImage" $root | quote }}
    imagePullPolicy: {{ $root.Values.smokeTest.pullPolicy | quote }}
    command:
      - python3
      - -c
      - |-
        import sys, time, urllib.request
        *urls, limit = sys.argv[1:]
        start = time.monotonic()
        for url in urls:
            last = "not tried"
            while True:
                try:
                    with urllib.request.urlopen(url, timeout=5) as reply:
                        if reply.status == 200:
                            print(f"{url} answers 200 after {time.monotonic() - start:.0f} s")
                            break
                        last = f"HTTP {reply.status}"
                except Exception as error:  # refused, a timeout, HTTP 503 while the model loads
                    last = str(error)
                if time.monotonic() - start >= float(limit):
                    sys.exit(f"{url} did not answer 200 within {float(limit):.0f} s ({last})")
                time.sleep(2)
      - {{ printf "%s/health" (trimSuffix "/" .candidate) | quote }}
      - {{ printf "%s/health" (trimSuffix "/" .baseline) | quote }}
      - {{ $gate.waitSeconds | quote }}
    env:
      # An HTTP client: no GPU, whatever the image's NVIDIA_VISIBLE_DEVICES says.
      - name: NVIDIA_VISIBLE_DEVICES
        value: void
    resources:
      requests:
        cpu: 10m
        memory: 32Mi
      limits:
        memory: 128Mi
    securityContext:
      {{- toYaml $root.Values.smokeTest.securityContext | nindent 6 }}
containers:
  - name: gate
    image: {{ include "deploykit.smokeImage" $root | quote }}
    imagePullPolicy: {{ $root.Values.smokeTest.pullPolicy | quote }}
    # `deploykit gate`: exit 0 promote, 6 hold (drift or slower), 1 hold: broken, 2 usage; the JSON report
    # on stdout (kubectl logs).
    command:
      - python3
      - -m
      - deploykit
      - gate
      - --profile
      - /etc/deploykit/profile.yaml
      - --url
      - {{ .candidate | quote }}
      - --baseline-url
      - {{ .baseline | quote }}
      - --facts
      - /etc/deploykit/facts.json
      {{- range $name, $key := $root.Values.smokeTest.secretEnv }}
      - --api-key-env
      - {{ $name | quote }}
      {{- end }}
      {{- if not $gate.load }}
      - --no-load
      {{- end }}
      {{- if not $gate.store.secretName }}
      - --no-store
      {{- end }}
      - --format
      - json
    env:
      {{- with include "deploykit.pythonPathEnv" (list $root "") }}
      {{- . | nindent 6 }}
      {{- end }}
      # An HTTP client: no GPU, whatever the image's NVIDIA_VISIBLE_DEVICES says.
      - name: NVIDIA_VISIBLE_DEVICES
        value: void
      - name: HOME
        value: /scratch
      - name: XDG_DATA_HOME
        value: /scratch
      # The root file system is read-only: anything temporary goes to the scratch volume too.
      - name: TMPDIR
        value: /scratch
      {{- range $name, $key := $root.Values.smokeTest.secretEnv }}
      - name: {{ $name | quote }}
        valueFrom:
          secretKeyRef:
            name: {{ $root.Values.secretName | quote }}
            key: {{ $key | quote }}
      {{- end }}
      {{- with $gate.store.secretName }}
      # The results store, credentials and all: from the Secret, never on the command line.
      - name: DEPLOYKIT_STORE
        valueFrom:
          secretKeyRef:
            name: {{ . | quote }}
            key: {{ $gate.store.secretKey | quote }}
      {{- end }}
    resources:
      {{- toYaml $gate.resources | nindent 6 }}
    securityContext:
      {{- toYaml $root.Values.smokeTest.securityContext | nindent 6 }}
    volumeMounts:
      - name: gate-config
        mountPath: /etc/deploykit
        readOnly: true
      - name: scratch
        mountPath: /scratch
      {{- with include "deploykit.pluginMount" $root }}
      {{- . | nindent 6 }}
      {{- end }}
volumes:
  {{- with include "deploykit.pluginVolume" $root }}
  {{- . | nindent 2 }}
  {{- end }}
  - name: scratch
    emptyDir: {}
  # profile.yaml and facts.json, side by side.
  - name: gate-config
    projected:
      sources:
        - configMap:
            name: {{ $root.Release.Name }}-profile
        - configMap:
            name: {{ $root.Release.Name }}-gate
{{- end -}}
