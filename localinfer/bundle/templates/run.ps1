# localinfer offline bundle launcher (written by `localinfer bundle create`).
#   .\run.ps1                 chat with the bundled model
#   .\run.ps1 run "PROMPT"    any localinfer command; the bundled model is the default
$ErrorActionPreference = "Stop"
$Here = $PSScriptRoot
$Py = $env:LOCALINFER_PYTHON
$PyArgs = @()
if (-not $Py) {
    if (Get-Command py -ErrorAction SilentlyContinue) { $Py = "py"; $PyArgs = @("-3") }
    elseif (Get-Command python -ErrorAction SilentlyContinue) { $Py = "python" }
    else { Write-Error "run.ps1: no Python found: install Python 3.10 or newer, or set LOCALINFER_PYTHON"; exit 1 }
}
$Tag = (& $Py @PyArgs "$Here\check.py" --target).Trim()
if (-not (Test-Path "$Here\wheels\$Tag\requirements.lock")) {
    $Have = (Get-ChildItem "$Here\wheels" -Directory | ForEach-Object Name) -join " "
    Write-Error "run.ps1: this bundle has no wheels for $Tag (it has: $Have)"
    exit 1
}
$State = Join-Path $Here ".runtime"
try {
    New-Item -ItemType Directory -Force -Path $State | Out-Null
    [IO.File]::WriteAllText((Join-Path $State ".probe"), "")
} catch {
    $State = Join-Path $env:LOCALAPPDATA "localinfer-bundles\@BUNDLE_ID@"
    New-Item -ItemType Directory -Force -Path $State | Out-Null
}
# state made for another folder or machine is never used (its venv points elsewhere, its
# compiled kernels are another CPU's)
$Owner = (& $Py @PyArgs "$Here\check.py" --owner $Here).Trim()
$OwnerFile = Join-Path $State "owner"
if ((Test-Path $OwnerFile) -and ((Get-Content $OwnerFile -Raw).Trim() -ne $Owner)) {
    Write-Host "run.ps1: $State was made on another machine or in another folder: starting over"
    Remove-Item -Recurse -Force $State
    New-Item -ItemType Directory -Force -Path $State | Out-Null
}
Set-Content -Path $OwnerFile -Value $Owner
$Venv = Join-Path $State "venv-$Tag"
$env:LOCALINFER_HOME = Join-Path $State "home"
$env:LOCALINFER_MODEL = @DEFAULT_MODEL_PS@
@SYSTEM_PS@
$Li = Join-Path $Venv "Scripts\localinfer.exe"
if (-not (Test-Path (Join-Path $Venv ".complete"))) {
    Write-Host "first run: checking the bundle's files"
    & $Py @PyArgs "$Here\check.py" $Here
    if ($LASTEXITCODE -ne 0) { exit 1 }
    Write-Host "first run: making a Python environment from the bundle's wheels (offline)"
    if (Test-Path $Venv) { Remove-Item -Recurse -Force $Venv }
    & $Py @PyArgs -m venv $Venv
    if ($LASTEXITCODE -ne 0) { Write-Error "run.ps1: $Py cannot make a venv"; exit 1 }
    & (Join-Path $Venv "Scripts\python.exe") -m pip install --quiet --disable-pip-version-check `
        --no-cache-dir --no-index --find-links "$Here\wheels\$Tag" --require-hashes `
        -r "$Here\wheels\$Tag\requirements.lock"
    if ($LASTEXITCODE -ne 0) { exit 1 }
    & $Li bundle install $Here --skip-check | Out-Host
    if ($LASTEXITCODE -ne 0) { exit 1 }
    & $Li bundle verify $Here --smoke --skip-check | Out-Host
    if ($LASTEXITCODE -ne 0) {
        Write-Warning "this machine's kernels answer the demo prompts differently from the machine that built the bundle"
    }
    New-Item -ItemType File -Path (Join-Path $Venv ".complete") | Out-Null
}
if ($args.Count -eq 0) { & $Li chat } else { & $Li @args }
exit $LASTEXITCODE
