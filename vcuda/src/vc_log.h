/* One-line log messages to stderr, filtered by VCUDA_LOG_LEVEL (read once). */
#ifndef VC_LOG_H
#define VC_LOG_H

enum { VC_LOG_SILENT = 0, VC_LOG_ERROR = 1, VC_LOG_WARN = 2, VC_LOG_INFO = 3, VC_LOG_DEBUG = 4 };

void vc_log_set_level(int level);
int vc_log_enabled(int level);
void vc_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define VC_ERROR(...) vc_log(VC_LOG_ERROR, __VA_ARGS__)
#define VC_WARN(...) vc_log(VC_LOG_WARN, __VA_ARGS__)
#define VC_INFO(...) vc_log(VC_LOG_INFO, __VA_ARGS__)
#define VC_DEBUG(...) vc_log(VC_LOG_DEBUG, __VA_ARGS__)

#endif
