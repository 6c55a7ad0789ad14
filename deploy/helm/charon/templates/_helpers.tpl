{{/* The objects' name: the release name when it holds "charon" (so that
`helm install charon` makes the Service charon the EnvoyFilter expects). */}}
{{- define "charon.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "charon.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "charon.labels" -}}
{{ include "charon.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "charon.redisSecret" -}}
{{- .Values.redis.existingSecret | default (printf "%s-redis" (include "charon.fullname" .)) -}}
{{- end -}}

{{/* The key of the Redis password in the Secret, or empty for none: the
chart's Secret holds it only when redis.password is given. */}}
{{- define "charon.redisPasswordKey" -}}
{{- if .Values.redis.existingSecret -}}
{{- .Values.redis.passwordKey -}}
{{- else if .Values.redis.password -}}
{{- .Values.redis.passwordKey | default "password" -}}
{{- end -}}
{{- end -}}

{{/* GOMEMLIMIT: goMemLimit, or else 90% of resources.limits.memory in MiB
(the rest is left to what is not Go heap), or else empty (no limit). */}}
{{- define "charon.goMemLimit" -}}
{{- $mem := dig "limits" "memory" "" (.Values.resources | default dict) -}}
{{- if .Values.goMemLimit -}}
{{- .Values.goMemLimit -}}
{{- else if $mem -}}
{{- $bytes := 0 -}}
{{- if kindIs "string" $mem -}}
{{- $re := "^([0-9]+)(|k|M|G|T|Ki|Mi|Gi|Ti)$" -}}
{{- if not (regexMatch $re $mem) -}}
{{- fail (printf "resources.limits.memory %q: the chart reads whole numbers with k, M, G, T, Ki, Mi, Gi or Ti; set goMemLimit (GOMEMLIMIT, e.g. 460MiB) yourself" $mem) -}}
{{- end -}}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- $bytes = mul (regexReplaceAll $re $mem "${1}" | int64) (get $units (regexReplaceAll $re $mem "${2}")) -}}
{{- else -}}
{{- $bytes = int64 $mem -}}
{{- end -}}
{{- $mib := div (mul $bytes 9) (mul 10 1048576) -}}
{{- if lt $mib 1 -}}
{{- fail (printf "resources.limits.memory %v: too small for a Go heap limit" $mem) -}}
{{- end -}}
{{- printf "%dMiB" $mib -}}
{{- end -}}
{{- end -}}
