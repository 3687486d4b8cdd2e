{{/* Labels on every object of the viz extension. */}}
{{- define "kinference-viz.labels" -}}
app.kubernetes.io/part-of: kinference
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Prometheus' URL as viz dials it: the chart's, or the user's. */}}
{{- define "kinference-viz.prometheusUrl" -}}
{{- if .Values.prometheus.enabled -}}
{{ printf "http://kinference-prometheus.%s.svc:9090" .Release.Namespace }}
{{- else -}}
{{ required "prometheus.url is required when prometheus.enabled is false" .Values.prometheus.url }}
{{- end -}}
{{- end }}
