{{- define "lvm-agent.labels" -}}
app.kubernetes.io/name: lvm-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "lvm-agent.selector" -}}
app.kubernetes.io/name: lvm-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "lvm-agent.mode" -}}
{{- $m := .Values.lvmd.mode -}}
{{- if not (has $m (list "sidecar" "host" "none")) -}}
{{- fail (printf "lvmd.mode must be sidecar, host or none, not %q" $m) -}}
{{- end -}}
{{- $m -}}
{{- end }}
