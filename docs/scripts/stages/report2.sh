# STAGE=report2 docs/scripts/gpu_session.sh: see report1.sh (its body tells them apart)
source "$STAGES/report1.sh"
