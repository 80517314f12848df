{{- /* Labels and selector of the agent's objects; the "For" forms take
(list . "app.kubernetes.io/name"), for the provisioner's. */}}
{{- define "lvm-agent.labels" -}}
{{ include "lvm-agent.labelsFor" (list . "lvm-agent") }}
{{- end }}

{{- define "lvm-agent.selector" -}}
{{ include "lvm-agent.selectorFor" (list . "lvm-agent") }}
{{- end }}

{{- define "lvm-agent.labelsFor" -}}
{{- $ctx := index . 0 -}}
{{ include "lvm-agent.selectorFor" . }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $ctx.Chart.Name $ctx.Chart.Version }}
{{- end }}

{{- define "lvm-agent.selectorFor" -}}
app.kubernetes.io/name: {{ index . 1 }}
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
{{- end }}

{{- /* A ServiceAccount's user name, as the API server sees it (the
admission policies' "agent" and "provisioner"). */}}
{{- define "lvm-agent.user" -}}
{{- printf "system:serviceaccount:%s:%s" (index . 0).Release.Namespace (index . 1) -}}
{{- end }}

{{- /* s as a CEL string literal. Names of users and groups here have no
quote or backslash; refuse one rather than escape it. */}}
{{- define "lvm-agent.celString" -}}
{{- if or (contains "'" .) (contains "\\" .) -}}
{{- fail (printf "%q: a quote or backslash cannot be a CEL string literal here" .) -}}
{{- end -}}
{{- printf "'%s'" . -}}
{{- end }}

{{- define "lvm-agent.mode" -}}
{{- $m := .Values.lvmd.mode -}}
{{- if not (has $m (list "sidecar" "host" "none")) -}}
{{- fail (printf "lvmd.mode must be sidecar, host or none, not %q" $m) -}}
{{- end -}}
{{- $m -}}
{{- end }}
