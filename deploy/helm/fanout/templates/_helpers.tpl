{{/* The release's name for its objects. */}}
{{- define "fanout.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "fanout.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component (orchestrator, worker, migrate). */}}
{{- define "fanout.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The image: by digest when one is given, else by tag. */}}
{{- define "fanout.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- end -}}

{{/* The pod security context every pod runs with. */}}
{{- define "fanout.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The container security context every container runs with. */}}
{{- define "fanout.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* The name of the CloudNativePG Cluster. */}}
{{- define "fanout.cnpgName" -}}
{{ include "fanout.fullname" . }}-db
{{- end -}}

{{- /*
The update strategy of a Deployment (dict "root" . "component" NAME): rolled
one pod at a time while the schema version stays the same; recreated (every
old pod of it gone before a new one of it starts) when the live Deployment's
pods run another schema version, or carry none (docs/kubernetes.md
"Upgrade"). The live object is read with lookup: `helm template` and a first
install see none and roll.
*/ -}}
{{- define "fanout.strategy" -}}
{{- $schema := index .root.Chart.Annotations "fanout.dev/schema-version" -}}
{{- $live := lookup "apps/v1" "Deployment" .root.Release.Namespace (printf "%s-%s" (include "fanout.fullname" .root) .component) -}}
{{- $liveSchema := "" -}}
{{- if $live -}}
{{- $liveSchema = index ($live.spec.template.metadata.annotations | default dict) "fanout.dev/schema-version" | default "" -}}
{{- end -}}
{{- if and $live (ne $liveSchema $schema) -}}
type: Recreate
{{- else -}}
type: RollingUpdate
rollingUpdate: {maxUnavailable: 1, maxSurge: 1}
{{- end -}}
{{- end -}}
