"""The embedded AWS Relevo runs on one machine: moto in server mode with the patches in relevo_local.moto, the
SAM template translated, a Lambda runtime, an API adapter, streams, a scheduler and a recorder."""
