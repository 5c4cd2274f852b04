#!/usr/bin/env bash
# spark-submit examples for the mqstore jobs (deploy/spark/README.md).
#
#   deploy/spark/submit-export.sh local  /data/commitlog /data/lake      # this machine
#   deploy/spark/submit-export.sh k8s    /data/commitlog /data/lake      # Kubernetes, cluster mode
#
# Environment for k8s: K8S_API (https://host:6443), IMAGE (Spark 4 + pyarrow + mqstore),
# NAMESPACE (default data), LOG_PVC (claim holding the commit log, mounted read-only).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
target=${1:?local or k8s}
log_dir=${2:?commit-log directory}
out=${3:?output directory}

case "$target" in
local)
    # The job module is a plain script: spark-submit runs it with this Python (mqstore installed).
    exec spark-submit --master 'local[*]' \
        --conf spark.sql.session.timeZone=UTC \
        "$(python -c 'import mqstore.spark.jobs.export as m; print(m.__file__)')" \
        "$out" --log "$log_dir"
    ;;
k8s)
    exec spark-submit \
        --master "k8s://${K8S_API:?}" --deploy-mode cluster --name mqstore-export \
        --conf spark.kubernetes.namespace="${NAMESPACE:-data}" \
        --conf spark.kubernetes.container.image="${IMAGE:?}" \
        --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark \
        --conf spark.executor.instances=2 --conf spark.executor.cores=2 \
        --conf spark.executor.memory=2g --conf spark.driver.memory=1g \
        --conf spark.sql.session.timeZone=UTC \
        --conf spark.kubernetes.driver.podTemplateFile="$here/pod-template.yaml" \
        --conf spark.kubernetes.executor.podTemplateFile="$here/pod-template.yaml" \
        --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.log.options.claimName="${LOG_PVC:?}" \
        --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.log.mount.path=/data \
        --conf spark.kubernetes.driver.volumes.persistentVolumeClaim.log.mount.readOnly=true \
        --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.log.options.claimName="${LOG_PVC:?}" \
        --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.log.mount.path=/data \
        --conf spark.kubernetes.executor.volumes.persistentVolumeClaim.log.mount.readOnly=true \
        local:///opt/mqstore/mqstore/spark/jobs/export.py \
        "$out" --log "$log_dir"
    ;;
*)
    echo "usage: $0 local|k8s LOG_DIR OUT" >&2
    exit 2
    ;;
esac
