/*
 * The --html report: one self-contained page (inline CSS, inline SVG, one small inline script;
 * nothing fetched), a section per trace with
 *   - the summary figures,
 *   - an SVG timeline of live, allocated and reserved bytes and one of the fragmentation rate,
 *     drawn here from the replay's samples (<= ~2000 points each),
 *   - a map of segments and blocks at the peak-live op, drawn by the script from the pool's own
 *     snapshot JSON, embedded as a data island (<script type="application/json">).
 * On load the script checks that every timeline polyline has a nonzero length and width and
 * sets <body data-timeline-rendered="yes" data-timeline-points="N">, which the browser test
 * reads from the rendered DOM.
 */
#include "cli.h"

#include <string.h>

enum { CHART_W = 960, CHART_H = 260, PAD_L = 80, PAD_R = 16, PAD_T = 12, PAD_B = 34 };

static void html_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static const char STYLE[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}"
    "h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ccc;padding-bottom:4px}"
    "h3{font-size:15px;margin-top:20px}"
    "table.summary{border-collapse:collapse}table.summary td{padding:2px 12px 2px 0;"
    "vertical-align:top}table.summary td:first-child{color:#555;white-space:nowrap}"
    "svg{display:block;overflow:visible}.axis{stroke:#888;stroke-width:1}"
    ".grid{stroke:#eee;stroke-width:1}.lbl{font-size:11px;fill:#555}"
    ".series{fill:none;stroke-width:1.5}.reserved{stroke:#d62728}"
    /* allocated is live + rounding, usually within a line's width of it: drawn wide and pale
     * under live, so that it shows as a band around the live line instead of hiding under it */
    ".allocated{stroke:#ff7f0e;stroke-width:6;stroke-opacity:.45}"
    ".live{stroke:#1f77b4}.frag{stroke:#9467bd}.peak{stroke:#2ca02c;stroke-dasharray:4 3}"
    ".legend span{display:inline-block;margin-right:16px}.legend i{display:inline-block;"
    "width:14px;height:3px;margin-right:4px;vertical-align:middle}"
    ".map .seg{font-size:11px;fill:#555}.note{color:#777}"
    "tr.incomplete td{color:#b00;font-weight:bold}h2 .incomplete{color:#b00}";

static double scale_x(uint64_t op, uint64_t ops)
{
    return PAD_L + (ops ? (double)op / (double)ops : 0) * (CHART_W - PAD_L - PAD_R);
}

static double scale_y(double v, double max)
{
    return PAD_T + (1 - (max > 0 ? v / max : 0)) * (CHART_H - PAD_T - PAD_B);
}

static void polyline(FILE *f, const replay_result *r, uint64_t ops, const char *cls, int which,
                     double max)
{
    fprintf(f, "<polyline class=\"series %s\" points=\"", cls);
    for (size_t i = 0; i < r->n_timeline; i++) {
        const timeline_point *p = &r->timeline[i];
        double v = which == 0 ? (double)p->live : which == 1 ? (double)p->allocated
                 : which == 2 ? (double)p->reserved : p->frag_rate;
        fprintf(f, "%s%.1f,%.1f", i ? " " : "", scale_x(p->op, ops), scale_y(v, max));
    }
    fputs("\"/>\n", f);
}

/* Frame, grid and axis labels; y labels from `label(fraction)` at 0, 1/2 and 1 of max. */
static void axes(FILE *f, uint64_t ops, const char *const ylabels[3], const char *title)
{
    double x0 = PAD_L, x1 = CHART_W - PAD_R, y0 = PAD_T, y1 = CHART_H - PAD_B;
    fprintf(f, "<svg class=\"timeline\" role=\"img\" aria-label=\"%s\" width=\"%d\" height=\"%d\""
            " viewBox=\"0 0 %d %d\" xmlns=\"http://www.w3.org/2000/svg\">\n", title, CHART_W,
            CHART_H, CHART_W, CHART_H);
    for (int i = 0; i < 3; i++) {
        double y = y1 - (y1 - y0) * i / 2.0;
        fprintf(f, "<line class=\"grid\" x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\"/>"
                "<text class=\"lbl\" x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                x0, y, x1, y, x0 - 6, y + 4, ylabels[i]);
    }
    fprintf(f, "<line class=\"axis\" x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\"/>"
            "<line class=\"axis\" x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\"/>\n",
            x0, y0, x0, y1, x0, y1, x1, y1);
    for (int i = 0; i <= 4; i++) {
        uint64_t op = ops * (uint64_t)i / 4;
        fprintf(f, "<text class=\"lbl\" x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%llu"
                "</text>\n", scale_x(op, ops), y1 + 16, (unsigned long long)op);
    }
    fprintf(f, "<text class=\"lbl\" x=\"%.0f\" y=\"%d\" text-anchor=\"end\">ops</text>\n", x1,
            CHART_H - 2);
}

static void peak_marker(FILE *f, const trace *t, uint64_t ops)
{
    if (!t->n_ops)
        return;
    double x = scale_x(t->peak_op + 1, ops);
    fprintf(f, "<line class=\"peak\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\"><title>peak live"
            " (op %zu)</title></line>\n", x, PAD_T, x, CHART_H - PAD_B, t->peak_op + 1);
}

static void timelines(FILE *f, const trace *t, const replay_result *r)
{
    uint64_t ops = t->n_ops, max = 1;
    for (size_t i = 0; i < r->n_timeline; i++)
        if (r->timeline[i].reserved > max)
            max = r->timeline[i].reserved;
    char l1[32], l2[32];
    format_bytes(max / 2, l1, sizeof l1);
    format_bytes(max, l2, sizeof l2);
    const char *bytes_labels[3] = {"0", l1, l2};
    fputs("<h3>Timeline: bytes</h3>\n<div class=\"legend\"><span><i style=\"background:#d62728\">"
          "</i>reserved</span><span><i style=\"background:#ff7f0e;opacity:.45;height:6px\"></i>"
          "allocated (the band under live)</span><span>"
          "<i style=\"background:#1f77b4\"></i>live</span><span><i style=\"background:#2ca02c\">"
          "</i>peak live</span></div>\n", f);
    axes(f, ops, bytes_labels, "live, allocated and reserved bytes over ops");
    polyline(f, r, ops, "reserved", 2, (double)max);
    polyline(f, r, ops, "allocated", 1, (double)max);
    polyline(f, r, ops, "live", 0, (double)max);
    peak_marker(f, t, ops);
    fputs("</svg>\n<h3>Timeline: fragmentation rate (1 - largest free / total free)</h3>\n", f);
    const char *rate_labels[3] = {"0 %", "50 %", "100 %"};
    axes(f, ops, rate_labels, "fragmentation rate over ops");
    polyline(f, r, ops, "frag", 3, 1.0);
    peak_marker(f, t, ops);
    fputs("</svg>\n", f);
}

static void summary_row(FILE *f, const char *name, const char *value)
{
    fprintf(f, "<tr><td>%s</td><td>", name);
    html_text(f, value);
    fputs("</td></tr>\n", f);
}

static void summary(FILE *f, const trace *t, const replay_result *r)
{
    char v[640], a[48], b[48];
    const gm_stats *fin = &r->final, *pk = &r->at_peak;
    fputs("<table class=\"summary\">\n", f);
    summary_row(f, "device", r->device.name);
    snprintf(v, sizeof v, "strategy=%s segments=%s release=%s",
             gm_strategy_str(r->resolved.pool.strategy), gm_segments_str(r->resolved.pool.segments),
             gm_release_str(r->resolved.pool.release));
    summary_row(f, "pool", v);
    snprintf(v, sizeof v, "%llu", (unsigned long long)r->ops);
    summary_row(f, "ops", v);
    format_bytes(fin->peak_live_bytes, a, sizeof a);
    format_bytes(fin->peak_reserved_bytes, b, sizeof b);
    snprintf(v, sizeof v, "%s live, %s reserved: reserved / live = %.3f", a, b,
             fin->peak_live_bytes ? (double)fin->peak_reserved_bytes / (double)fin->peak_live_bytes
                                  : 0.0);
    summary_row(f, "peak", v);
    char note[256];
    if (replay_incomplete_note(r, note, sizeof note)) {
        fputs("<tr class=\"incomplete\"><td>not a full replay</td><td>", f);
        html_text(f, note);
        fputs("</td></tr>\n", f);
    }
    format_bytes(pk->internal_frag_bytes, a, sizeof a);
    format_bytes(pk->total_free_bytes, b, sizeof b);
    snprintf(v, sizeof v, "internal %s, external %s, frag rate %.3f (worst %.3f at op %llu)", a,
             b, pk->frag_rate, r->worst_frag_rate, (unsigned long long)r->worst_frag_op);
    summary_row(f, "fragmentation at peak", v);
    size_t used = 0;
    v[0] = 0;
    for (int k = 0; k < GM_CALL_KINDS && used < sizeof v; k++)
        if (fin->device_calls[k])
            used += (size_t)snprintf(v + used, sizeof v - used, "%s%s %llu", used ? ", " : "",
                                     gm_call_str((gm_call)k),
                                     (unsigned long long)fin->device_calls[k]);
    summary_row(f, "device calls", used ? v : "none");
    snprintf(v, sizeof v, "%.3f ms device time, %.1f host ns/op (median of %u timed passes, "
             "%.1f-%.1f)", (double)fin->device_time_ns / 1e6, r->ns_per_op, r->timed_passes,
             r->ns_per_op_min, r->ns_per_op_max);
    summary_row(f, "time", v);
    if (r->defrag_shown) {
        format_bytes(r->defrag_bytes_moved, a, sizeof a);
        snprintf(v, sizeof v, "movable %.3f, defrag %s: %llu steps, %llu blocks moved, %s moved, "
                 "%.3f ms copy time (%s)", r->movable_fraction, r->defrag_enabled ? "on" : "off",
                 (unsigned long long)r->defrag_steps, (unsigned long long)r->defrag_blocks_moved,
                 a, (double)r->defrag_copy_ns / 1e6,
                 backend_named_simulated(r->device.backend) ? "simulated" : "measured");
        summary_row(f, "defragmentation", v);
    }
    snprintf(v, sizeof v, "%llu out-of-memory; bad input: %llu malformed, %llu unknown frees, "
             "%llu double allocates, %llu truncated", (unsigned long long)r->oom_count,
             (unsigned long long)t->problems[TRACE_MALFORMED],
             (unsigned long long)t->problems[TRACE_UNKNOWN_FREE],
             (unsigned long long)t->problems[TRACE_DOUBLE_ALLOC],
             (unsigned long long)t->problems[TRACE_TRUNCATED]);
    summary_row(f, "problems", v);
    format_bytes(r->recommended_initial_reserve, a, sizeof a);
    if (r->recommended_initial_reserve)
        snprintf(v, sizeof v, "%s: --set initial_reserve=%llu", a,
                 (unsigned long long)r->recommended_initial_reserve);
    else
        snprintf(v, sizeof v, "no initial_reserve (one raises peak reserved on this trace)");
    summary_row(f, "recommended pool", v);
    fputs("</table>\n", f);
}

/* The snapshot as a JSON data island; '<' is escaped inside strings so "</script>" cannot end
 * the island early ('<' can occur only inside JSON strings). */
static void snapshot_island(FILE *f, size_t index, const replay_result *r)
{
    fprintf(f, "<script type=\"application/json\" id=\"snapshot-%zu\">", index);
    if (r->snapshot) {
        for (size_t i = 0; i < r->snapshot_len; i++) {
            if (r->snapshot[i] == '<')
                fputs("\\u003c", f);
            else
                fputc(r->snapshot[i], f);
        }
    } else {
        fputs("null", f);
    }
    fputs("</script>\n", f);
}

static const char SCRIPT[] =
    "(function(){\n"
    "var body=document.body;\n"
    "function num(v){if(typeof v==='number')return v;if(typeof v!=='string')return 0;"
    "return /^0x/i.test(v)?parseInt(v,16):Number(v);}\n"
    "function fmt(b){var u=['B','KiB','MiB','GiB','TiB'],i=0;while(b>=1024&&i<4){b/=1024;i++;}"
    "return (i?b.toFixed(2):b)+' '+u[i];}\n"
    "var NS='http://www.w3.org/2000/svg';\n"
    "function el(n,a,p){var e=document.createElementNS(NS,n);for(var k in a)e.setAttribute(k,a[k]);"
    "if(p)p.appendChild(e);return e;}\n"
    "var COLORS={allocated:'#1f77b4',live:'#1f77b4',free:'#d9d9d9',cached:'#98df8a',pending:'#ff7f0e'};\n"
    "var MAX_SEGMENTS=400,BAR=700,ROW=18;\n"
    "function drawMap(div){\n"
    " var snap=JSON.parse(document.getElementById(div.dataset.snapshot).textContent);\n"
    " if(!snap||!snap.segments){div.textContent='no snapshot';return 0;}\n"
    " var segs=snap.segments,n=Math.min(segs.length,MAX_SEGMENTS),maxSpan=1,blocks=0,i,j;\n"
    /* A VMM arena is a huge virtual range: draw it up to its mapped extent or last used block. */
    " var spans=[];for(i=0;i<n;i++){var s=segs[i],base=num(s.address),used=0,bl=s.blocks||[],"
    "span=num(s.size),mapped=num(s.mapped_bytes);\n"
    "  for(j=0;j<bl.length;j++)if(bl[j].state!=='free')"
    "used=Math.max(used,num(bl[j].address)-base+num(bl[j].size));\n"
    "  if(s.mapped_bytes!==undefined&&mapped<span)span=Math.max(used,mapped,1);\n"
    "  spans.push(span);maxSpan=Math.max(maxSpan,span);}\n"
    " var svg=el('svg',{width:BAR,height:Math.max(n,1)*ROW+4,class:'map'},div),texts=[],LABEL=0;\n"
    /* Labels first, measured, so the bars start after the longest one (none is clipped). A VMM
     * span is labelled by its mapped bytes; its whole virtual range is in the tooltip. */
    " for(i=0;i<n;i++){var sg=segs[i],vmm=sg.segments==='vmm'||(sg.mapped_bytes!==undefined&&"
    "num(sg.mapped_bytes)!==num(sg.size)),t=el('text',{x:0,y:i*ROW+14,class:'seg'},svg);\n"
    "  t.textContent=(sg.address||'')+' '+(vmm?fmt(num(sg.mapped_bytes))+' mapped':"
    "fmt(num(sg.size)))+(sg.kind?' '+sg.kind:'')+(vmm?' vmm':'');\n"
    "  el('title',{},t).textContent=vmm?'virtual range '+fmt(num(sg.size))+', '+"
    "fmt(num(sg.mapped_bytes))+' of it mapped':fmt(num(sg.size))+' segment';\n"
    "  texts.push(t);LABEL=Math.max(LABEL,t.getComputedTextLength());}\n"
    " LABEL=Math.ceil(LABEL)+10;svg.setAttribute('width',LABEL+BAR);\n"
    " var fits=true;texts.forEach(function(t){var b=t.getBBox();"
    "if(b.x<0||b.x+b.width>LABEL)fits=false;});body.dataset.labelsFit=fits?'yes':'no';\n"
    " for(i=0;i<n;i++){var seg=segs[i],b0=num(seg.address),y=i*ROW+2,bw=Math.max(40,"
    "BAR*spans[i]/maxSpan),list=seg.blocks||[];\n"
    "  el('rect',{x:LABEL,y:y,width:bw,height:ROW-4,fill:'#fff',stroke:'#999'},svg);\n"
    "  for(j=0;j<list.length;j++){var b=list[j],off=num(b.address)-b0;if(off>=spans[i])continue;\n"
    "   var x=LABEL+bw*off/spans[i],"
    "w=Math.max(0.5,bw*Math.min(num(b.size),spans[i]-off)/spans[i]);\n"
    "   var r=el('rect',{x:x,y:y,width:w,height:ROW-4,fill:COLORS[b.state]||'#ff7f0e'},svg);\n"
    "   el('title',{},r).textContent=b.address+' '+fmt(num(b.size))+' '+b.state+"
    "(b.requested!==undefined?', requested '+fmt(num(b.requested)):'')+"
    "(b.stream!==undefined?', stream '+b.stream:'');blocks++;}}\n"
    " if(segs.length>n){var p=document.createElement('p');p.className='note';"
    "p.textContent=(segs.length-n)+' more segments not drawn';div.appendChild(p);}\n"
    " return blocks;}\n"
    "var maps=document.querySelectorAll('div.map'),blocks=0;\n"
    "try{maps.forEach(function(d){blocks+=drawMap(d);});body.dataset.mapBlocks=String(blocks);}"
    "catch(e){body.dataset.mapError=String(e);}\n"
    "try{var lines=document.querySelectorAll('svg.timeline polyline.series'),ok=lines.length>0,"
    "pts=0;\n"
    " lines.forEach(function(l){var bb=l.getBBox();if(!(l.getTotalLength()>0)||!(bb.width>0))"
    "ok=false;pts+=l.points.numberOfItems;});\n"
    /* the allocated line must show beside live: drawn wider than it */
    " var la=document.querySelector('polyline.allocated'),ll=document.querySelector('polyline.live');"
    "if(la&&ll)body.dataset.allocatedVisible=parseFloat(getComputedStyle(la).strokeWidth)>"
    "parseFloat(getComputedStyle(ll).strokeWidth)?'yes':'no';\n"
    " body.dataset.timelinePoints=String(pts);body.dataset.timelineRendered=ok?'yes':'no';}\n"
    "catch(e){body.dataset.timelineRendered='no';body.dataset.timelineError=String(e);}\n"
    "})();\n";

int report_html(const char *path, const trace *const *traces, const replay_result *const *results,
                size_t n)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            "<title>gpumem replay report</title>\n<style>%s</style></head>\n<body>\n"
            "<h1>gpumem replay report</h1>\n<p class=\"note\">gpumem %s. Bytes are binary "
            "(1 GiB = 2<sup>30</sup> bytes). Timelines are sampled every ceil(ops / 2000) ops."
            "</p>\n", STYLE, gm_version());
    for (size_t i = 0; i < n; i++) {
        fputs("<section class=\"trace\">\n<h2>", f);
        html_text(f, traces[i]->path);
        if (results[i]->oom_count) /* the headline below is not the trace's */
            fputs(" <span class=\"incomplete\">(INCOMPLETE: allocations failed)</span>", f);
        fputs("</h2>\n", f);
        summary(f, traces[i], results[i]);
        timelines(f, traces[i], results[i]);
        fprintf(f, "<h3>Segments and blocks at peak live (op %zu)</h3>\n<p class=\"note\">One row "
                "per segment, scaled to the largest (a VMM arena up to its mapped or used extent); "
                "blue: live, grey: free, green: cached (freed, kept for reuse), orange: pending (waiting for another stream; hover for details).</p>\n"
                "<div class=\"map\" data-snapshot=\"snapshot-%zu\"></div>\n", traces[i]->n_ops ? traces[i]->peak_op + 1 : 0, i);
        snapshot_island(f, i, results[i]);
        fputs("</section>\n", f);
    }
    fprintf(f, "<script>\n%s</script>\n</body></html>\n", SCRIPT);
    int failed = ferror(f);
    return fclose(f) == 0 && !failed ? 0 : -1;
}
