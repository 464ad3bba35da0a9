// WebPush module.
