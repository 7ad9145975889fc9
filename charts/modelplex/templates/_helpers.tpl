{{/*
The chart's name, truncated to 63 characters (a label value's limit).
*/}}
{{- define "modelplex.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
A fully qualified name for the release's objects: the release name when it already holds the
chart's name, else "<release>-<chart>"; truncated to 63 characters.
*/}}
{{- define "modelplex.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
"name-version" of the chart, for the helm.sh/chart label.
*/}}
{{- define "modelplex.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The labels of every object of the chart.
*/}}
{{- define "modelplex.labels" -}}
helm.sh/chart: {{ include "modelplex.chart" . }}
{{ include "modelplex.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: modelplex
{{- end }}

{{/*
The labels that select the operator's pods (never change them: a Deployment's selector is immutable).
*/}}
{{- define "modelplex.selectorLabels" -}}
app.kubernetes.io/name: {{ include "modelplex.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/*
The operator's ServiceAccount name.
*/}}
{{- define "modelplex.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "modelplex.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The operator's image.
*/}}
{{- define "modelplex.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion (toString .Values.image.tag)) }}
{{- end }}

{{/*
The router image the operator puts into each resource's router Deployment.
*/}}
{{- define "modelplex.routerImage" -}}
{{- printf "%s:%s" .Values.routerImage.repository (default .Chart.AppVersion (toString .Values.routerImage.tag)) }}
{{- end }}

{{/*
The operator's rights (rbac.yaml explains each): one list for the ClusterRole of a cluster-wide
install and the Role of each watched namespace.
*/}}
{{- define "modelplex.operatorRules" -}}
- apiGroups: ["modelplex.io"]
  resources: ["multiplexeddeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["modelplex.io"]
  resources: ["multiplexeddeployments/status"]
  verbs: ["get", "patch"]
- apiGroups: ["modelplex.io"]
  resources: ["multiplexeddeployments/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments/scale"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts", "configmaps"]
  verbs: ["get", "create", "patch"]
# Each deployment's internal credential, N-internal: made once, read back (the operator's own
# calls send it), patched once to end an upgrade from the namespace's modelplex-internal (read
# then); a deployment's auth Secret read for its client names. Names are the users' (no
# resourceNames); never listed or watched.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create", "get", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# The Gateway API Inference Extension's InferencePool of a deployment with
# spec.router.endpointPicker on (its CRD is not the chart's): applied, and deleted once the picker
# is turned off (only the operator's own, by uid). Without the CRD these rights grant nothing.
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "create", "patch", "delete"]
{{- end }}

{{/*
"true" where the server serves ValidatingAdmissionPolicy v1 (Kubernetes 1.30 and later), else empty.
*/}}
{{- define "modelplex.hasAdmissionPolicies" -}}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version }}true{{ end }}
{{- end }}
