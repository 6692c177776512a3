#!/usr/bin/env bash
# Fetch the jars Spark needs for s3a:// (hadoop-aws + the AWS SDK v2 it
# depends on) from Maven Central, matching the Hadoop version pyspark ships.
#
# Usage: fetch_spark_s3_jars.sh [PYTHON]   (or: python -m hybridflow.backends.spark_s3_jars)
#   PYTHON                  interpreter whose pyspark to match (default: python)
#   HYBRIDFLOW_JARS         cache root (default: $HOME/.cache/hybridflow/jars)
#   HYBRIDFLOW_S3_JARS=slim opt in to ~13 MB of individual SDK modules instead
#                           of the ~690 MB shaded SDK bundle (see below)
#
# Jars go to $HYBRIDFLOW_JARS/hadoop-<version>[-slim]/ (one directory per
# Hadoop version, so a pyspark upgrade never mixes versions).  Idempotent:
# when that directory is already complete nothing is downloaded.  The last
# stdout line is that directory; put every *.jar in it on Spark's classpath.
#
# Default ("bundle"): hadoop-aws's own compile-scope dependency set, i.e.
#   org.apache.hadoop:hadoop-aws:<hadoop version>
#   software.amazon.awssdk:bundle:<version hadoop-aws's pom names>     (~690 MB)
#   software.amazon.s3.analyticsaccelerator:analyticsaccelerator-s3     (~2.5 MB)
# (wildfly-openssl, runtime scope and only used for native TLS, is left out.)
#
# "slim" swaps the bundle for the SDK modules hadoop-aws uses (s3,
# s3-transfer-manager, sts, apache-client, netty-nio-client and their
# dependencies, same SDK version) minus what pyspark already ships (netty,
# httpclient, commons-codec/logging, slf4j).  Those modules are not shaded, so
# they run against Spark's netty 4.2 / httpclient 4.5 instead of the versions
# the SDK was built with; Hadoop itself only supports the bundle.
set -euo pipefail

PROG=fetch_spark_s3_jars
DEP_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1

die() { echo "$PROG: error: $*" >&2; exit 1; }

PYTHON=${1:-python}
command -v "$PYTHON" >/dev/null 2>&1 || die "python interpreter not found: $PYTHON"

SPARK_JARS_DIR=$("$PYTHON" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))' 2>/dev/null) \
    || die "cannot import pyspark with $PYTHON"
[ -d "$SPARK_JARS_DIR" ] || die "pyspark jars directory missing: $SPARK_JARS_DIR"

shopt -s nullglob
api_jars=("$SPARK_JARS_DIR"/hadoop-client-api-*.jar)
shopt -u nullglob
[ "${#api_jars[@]}" -eq 1 ] || die "expected exactly one hadoop-client-api-*.jar in $SPARK_JARS_DIR, found ${#api_jars[@]}"
HADOOP_VERSION=$(basename "${api_jars[0]}" .jar)
HADOOP_VERSION=${HADOOP_VERSION#hadoop-client-api-}
[[ "$HADOOP_VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]] || die "cannot parse Hadoop version from ${api_jars[0]}"

FLAVOR=${HYBRIDFLOW_S3_JARS:-bundle}
case "$FLAVOR" in
    bundle) SUFFIX= ;;
    slim) SUFFIX=-slim ;;
    *) die "HYBRIDFLOW_S3_JARS must be 'bundle' or 'slim', not '$FLAVOR'" ;;
esac

CACHE_ROOT=${HYBRIDFLOW_JARS:-$HOME/.cache/hybridflow/jars}
DEST=$CACHE_ROOT/hadoop-$HADOOP_VERSION$SUFFIX
MARKER=$DEST/.complete     # lists the jar files of a finished download

is_complete() {
    [ -s "$MARKER" ] || return 1
    local f
    while IFS= read -r f; do
        [ -s "$DEST/$f" ] || return 1
    done <"$MARKER"
}

mkdir -p "$CACHE_ROOT" || die "cannot create cache directory $CACHE_ROOT"

# Serialise concurrent runs (another process may be mid-download).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE_ROOT/.lock" || die "cannot open lock file $CACHE_ROOT/.lock"
    flock 9 || die "cannot lock $CACHE_ROOT/.lock"
fi

if is_complete; then
    echo "$DEST"
    exit 0
fi

command -v mvn >/dev/null 2>&1 || die "mvn not found on PATH (needed to fetch hadoop-aws $HADOOP_VERSION)"

WORK=$(mktemp -d "$CACHE_ROOT/.fetch.XXXXXX") || die "cannot create temp directory in $CACHE_ROOT"
trap 'rm -rf "$WORK"' EXIT

# Throwaway poms depending on hadoop-aws let Maven resolve the exact
# dependency versions hadoop-aws's pom (via its parent hadoop-project) names.
write_pom() {  # $1: directory, $2: rest of the hadoop-aws <dependency> and further ones
    mkdir -p "$1"
    cat >"$1/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>hybridflow.local</groupId>
  <artifactId>spark-s3-jars</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.hadoop</groupId>
      <artifactId>hadoop-aws</artifactId>
      <version>$HADOOP_VERSION</version>
$2
  </dependencies>
</project>
POM
}

run_mvn() {  # $1: pom directory, $2: what for (error message), rest: mvn arguments
    local dir=$1 what=$2 err
    shift 2
    if ! (cd "$dir" && mvn -B -q -ntp -Dstyle.color=never "$@") >"$WORK/mvn.log" 2>&1; then
        err=$(sed 's/\x1b\[[0-9;]*m//g' "$WORK/mvn.log" | grep -m1 '^\[ERROR\] *[^ ]' | cut -c1-400 || true)
        die "mvn failed to $what: ${err:-see mvn output}"
    fi
}

echo "$PROG: fetching hadoop-aws $HADOOP_VERSION and its AWS SDK ($FLAVOR) into $DEST" >&2
write_pom "$WORK/full" '    </dependency>'
if [ "$FLAVOR" = bundle ]; then
    run_mvn "$WORK/full" "fetch hadoop-aws $HADOOP_VERSION and the AWS SDK bundle (~690 MB)" \
        "$DEP_PLUGIN:copy-dependencies" -DincludeScope=compile -DoutputDirectory="$WORK/jars"
    shopt -s nullglob
    bundle=("$WORK"/jars/bundle-*.jar)
    shopt -u nullglob
    [ "${#bundle[@]}" -eq 1 ] || die "AWS SDK bundle jar missing after mvn run"
else
    run_mvn "$WORK/full" "resolve hadoop-aws $HADOOP_VERSION dependencies" \
        "$DEP_PLUGIN:list" -DincludeScope=compile -DoutputFile="$WORK/deps.txt"
    SDK_VERSION=$(sed -n 's/^ *software\.amazon\.awssdk:bundle:jar:\([^:]*\):.*/\1/p' "$WORK/deps.txt" | head -n1)
    [ -n "$SDK_VERSION" ] || die "hadoop-aws $HADOOP_VERSION does not depend on software.amazon.awssdk:bundle"
    deps='      <exclusions>
        <exclusion><groupId>software.amazon.awssdk</groupId><artifactId>bundle</artifactId></exclusion>
        <exclusion><groupId>org.wildfly.openssl</groupId><artifactId>wildfly-openssl</artifactId></exclusion>
      </exclusions>
    </dependency>'
    for m in s3 s3-transfer-manager sts apache-client netty-nio-client; do
        deps+="
    <dependency><groupId>software.amazon.awssdk</groupId><artifactId>$m</artifactId><version>$SDK_VERSION</version></dependency>"
    done
    write_pom "$WORK/slim" "$deps"
    run_mvn "$WORK/slim" "fetch AWS SDK $SDK_VERSION modules" \
        "$DEP_PLUGIN:copy-dependencies" -DincludeScope=runtime -DoutputDirectory="$WORK/jars" \
        -DexcludeGroupIds=io.netty,org.apache.httpcomponents,commons-codec,commons-logging,org.slf4j
    [ -s "$WORK/jars/s3-$SDK_VERSION.jar" ] || die "s3-$SDK_VERSION.jar missing after mvn run"
fi
[ -s "$WORK/jars/hadoop-aws-$HADOOP_VERSION.jar" ] || die "hadoop-aws-$HADOOP_VERSION.jar missing after mvn run"

(cd "$WORK/jars" && ls -1 -- *.jar) >"$WORK/jars/.complete"

# Replace any partial earlier attempt, then move the finished set into place.
rm -rf "$DEST"
mv "$WORK/jars" "$DEST" || die "cannot move jars into $DEST"
is_complete || die "cache directory $DEST incomplete after download"

echo "$DEST"
