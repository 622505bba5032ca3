{{- define "inferlb.fullname" -}}
{{- if contains "inferlb" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-inferlb" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "inferlb.labels" -}}
app.kubernetes.io/name: inferlb
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "inferlb.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "inferlb.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}
{{ default (include "inferlb.fullname" .) .Values.serviceAccount.name }}
{{- else -}}
{{ default "default" .Values.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{- define "inferlb.fleetConfigMap" -}}
{{ default (printf "%s-fleet" (include "inferlb.fullname" .)) .Values.fleet.configMap }}
{{- end -}}

{{- define "inferlb.tokenSecret" -}}
{{ default (printf "%s-token" (include "inferlb.fullname" .)) .Values.auth.existingSecret }}
{{- end -}}

{{/* Every control-plane replica's stable address (StatefulSet + headless Service). */}}
{{- define "inferlb.controlPlanes" -}}
{{- $name := printf "%s-control-plane" (include "inferlb.fullname" .) -}}
{{- $addrs := list -}}
{{- range $i, $_ := until (int .Values.controlPlane.replicas) -}}
{{- $addrs = append $addrs (printf "%s-%d.%s.%s.svc:%d" $name $i $name $.Release.Namespace (int $.Values.controlPlane.xdsPort)) -}}
{{- end -}}
{{- join "," $addrs -}}
{{- end -}}
