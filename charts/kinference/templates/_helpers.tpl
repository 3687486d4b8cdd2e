{{/*
Labels on every object. `helm.sh/chart` and `app.kubernetes.io/managed-by` are Helm's own; `kinfctl
install` writes all the others, and its test compares them.
*/}}
{{- define "kinference.labels" -}}
app.kubernetes.io/part-of: kinference
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
kinference.io/control-plane-ns: {{ .Release.Namespace }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The policy controller's labels, and the subset that selects its pods. */}}
{{- define "kinference.controller.selectorLabels" -}}
kinference.io/control-plane-component: policy-controller
kinference.io/control-plane-ns: {{ .Release.Namespace }}
{{- end }}

{{- define "kinference.controller.labels" -}}
{{ include "kinference.labels" . }}
app.kubernetes.io/name: policy-controller
app.kubernetes.io/component: controller
kinference.io/control-plane-component: policy-controller
{{- end }}

{{/* The controller's name: its Deployment, Service, ServiceAccount and PodDisruptionBudget. */}}
{{- define "kinference.controller.name" -}}
kinference-policy-controller
{{- end }}

{{/*
Whether the controller replicas judge rollouts together (docs/rollout.md, "Several replicas"): with
more than one, each holds only its own proxies' reports, so each fetches the others' window sums
through the headless Service `kinference.controller.peersName`. "true" or empty.
*/}}
{{- define "kinference.controller.peers" -}}
{{- if gt (int .Values.controller.replicas) 1 }}true{{ end -}}
{{- end }}

{{/* The controller's headless Service, one address per replica: its rollout peers. */}}
{{- define "kinference.controller.peersName" -}}
{{ printf "%s-peers" (include "kinference.controller.name" .) }}
{{- end }}

{{/* The replicas' admin port behind that Service, as `--rollout-peers` (KINFERENCE_ROLLOUT_PEERS) takes it. */}}
{{- define "kinference.controller.peersAddr" -}}
{{ printf "%s.%s.svc.%s:9990" (include "kinference.controller.peersName" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/* Cluster-scoped objects carry the namespace, so that their names say which install owns them. */}}
{{- define "kinference.clusterName" -}}
{{ printf "kinference-%s-%s" .root.Release.Namespace .component }}
{{- end }}

{{/* An image reference; an empty tag means the chart's appVersion. */}}
{{- define "kinference.image" -}}
{{ printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* The controller's gRPC address as the proxies dial it. */}}
{{- define "kinference.controllerAddr" -}}
{{ printf "http://%s.%s.svc.%s:8090" (include "kinference.controller.name" .) .Release.Namespace .Values.clusterDomain }}
{{- end }}

{{/*
The engine-signals service's address the proxies dial (signals.enabled): the controller's Service.
*/}}
{{- define "kinference.signalsAddr" -}}
{{ printf "http://%s.%s.svc.%s:%v" (include "kinference.controller.name" .) .Release.Namespace .Values.clusterDomain .Values.signals.port }}
{{- end }}

{{/* A signal shard's Deployment and Service name (signals.shards). */}}
{{- define "kinference.signalsShard.name" -}}
{{ printf "kinference-signals-%s" . }}
{{- end }}

{{/* A signal shard's address as the proxies dial it: its Service. Called with (dict "root" $ "name" NAME). */}}
{{- define "kinference.signalsShardAddr" -}}
{{ printf "http://%s.%s.svc.%s:%v" (include "kinference.signalsShard.name" .name) .root.Release.Namespace .root.Values.clusterDomain .root.Values.signals.port }}
{{- end }}

{{/*
The labels that select a signal shard's pods. Called with (dict "root" $ "name" NAME). The name is
quoted: a name the schema allows, such as `123` or `on`, is otherwise read back as a number or a
boolean, which no label value may be.
*/}}
{{- define "kinference.signalsShard.selectorLabels" -}}
kinference.io/control-plane-component: signals-shard
kinference.io/control-plane-ns: {{ .root.Release.Namespace }}
kinference.io/signals-shard: {{ .name | quote }}
{{- end }}

{{/*
The webhooks' serving certificate, as YAML with base64 `crt`, `key` and `ca`. With `auto`, an
existing Secret is kept (so upgrades do not rotate the CA under running webhooks); otherwise a CA and
a serving certificate are generated. Called once per render: the Secret and both webhook
configurations live in one template so that they share it.
*/}}
{{- define "kinference.webhookTLS" -}}
{{- $name := include "kinference.controller.name" . -}}
{{- if .Values.webhook.tls.auto -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (printf "%s-tls" $name) -}}
{{- if and $existing (index ($existing.data | default dict) "tls.crt") (index ($existing.data | default dict) "ca.crt") -}}
crt: {{ index $existing.data "tls.crt" }}
key: {{ index $existing.data "tls.key" }}
ca: {{ index $existing.data "ca.crt" }}
{{- else -}}
{{- $host := printf "%s.%s.svc" $name .Release.Namespace -}}
{{- $ca := genCA "kinference-webhook-ca" (int .Values.webhook.tls.validityDays) -}}
{{- $cert := genSignedCert $host nil (list $host (printf "%s.%s" $host .Values.clusterDomain)) (int .Values.webhook.tls.validityDays) $ca -}}
crt: {{ $cert.Cert | b64enc }}
key: {{ $cert.Key | b64enc }}
ca: {{ $ca.Cert | b64enc }}
{{- end -}}
{{- else -}}
{{- if not (and .Values.webhook.tls.certificate .Values.webhook.tls.key .Values.webhook.tls.caBundle) -}}
{{- fail "webhook.tls.auto is false: set webhook.tls.certificate, webhook.tls.key and webhook.tls.caBundle" -}}
{{- end -}}
crt: {{ .Values.webhook.tls.certificate | b64enc }}
key: {{ .Values.webhook.tls.key | b64enc }}
ca: {{ .Values.webhook.tls.caBundle | b64enc }}
{{- end -}}
{{- end }}
