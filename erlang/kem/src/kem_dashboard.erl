%%% @doc The operators' dashboard (docs/dashboard.md): one self-contained
%%% HTML page (`priv/dashboard.html', its charts drawn by its own script as
%%% plain SVG) and the figures it polls, as a JSON-ready map.
%%%
%%% `data/0' gathers what the node knows now: port groups (`kem_place'),
%%% each port's health and figures (asked with a 1 s timeout, as the
%%% metrics page does: a poll must not wait on a busy port), the spares,
%%% calls, errors and latency per kernel over the last five minutes
%%% (`kem_dashboard_stats'), totals since start (`kem_metrics'), quarantined
%%% kernels, open sessions, pool bytes and the other kem nodes of the
%%% cluster (`kem_cluster:stats/0'). Nothing in it names a process or
%%% a node path: no pids or OS pids (issue 24: a pid that changes tells a
%%% stranger when a port restarted), port health reasons through
%%% `kem_redact'. Kernel ids are strangers' text; the page writes them with
%%% `textContent' only.
%%%
%%% `page/0' is the page with the current figures inside it, so it shows
%%% something where it cannot poll (a node without HTTP, the page saved to
%%% a file); served over HTTP it refreshes every 2 s. `http_page/0' adds a
%%% Content-Security-Policy that lets only the page's own script (by its
%%% SHA-256) run and fetch only from the node.
-module(kem_dashboard).

-export([page/0, data/0, http_page/0]).

-define(PORT_TIMEOUT_MS, 1000).
-define(SNAPSHOT, <<"__KEM_SNAPSHOT__">>).
%% A minute of the window for "calls/s now": six 10-second slots.
-define(RATE_SLOTS, 6).
-define(MAX_QUARANTINED, 50).

%% @doc The page, with the figures of now inside it.
-spec page() -> {ok, binary()} | {error, {not_found, binary()}}.
page() ->
    case template() of
        {ok, Html} -> {ok, binary:replace(Html, ?SNAPSHOT, script_safe(kem_json:encode(data())))};
        Error -> Error
    end.

%% @doc The page as `dev_kem' replies with it: HTML, never cached, and a
%% policy that runs the page's own script and style only (by hash).
-spec http_page() -> {ok, map()} | {error, {not_found, binary()}}.
http_page() ->
    case page() of
        {ok, Html} ->
            {ok, #{<<"status">> => 200, <<"content-type">> => <<"text/html; charset=utf-8">>,
                   <<"cache-control">> => <<"no-store">>,
                   <<"content-security-policy">> => policy(Html), <<"body">> => Html}};
        Error ->
            Error
    end.

template() ->
    case code:priv_dir(kem) of
        {error, _} -> not_installed();
        Dir ->
            case file:read_file(filename:join(Dir, "dashboard.html")) of
                {ok, Html} -> {ok, Html};
                {error, _} -> not_installed()
            end
    end.

not_installed() ->
    {error, {not_found, <<"the dashboard page is not installed with kem (priv/dashboard.html)">>}}.

%% JSON inside a <script> element: `<' escaped, so no text in it can
%% close the element (`</script>'), whatever a kernel id holds.
script_safe(Json) ->
    binary:replace(binary:replace(Json, <<"<">>, <<"\\u003c">>, [global]), <<">">>, <<"\\u003e">>, [global]).

policy(Html) ->
    iolist_to_binary(["default-src 'none'; script-src ", hash(<<"script">>, Html), "; style-src ",
                      hash(<<"style">>, Html), "; connect-src 'self'; img-src 'self' data:; "
                      "base-uri 'none'; form-action 'none'"]).

%% 'sha256-...' of the first <Tag> element's text (the page has one of each).
hash(Tag, Html) ->
    [_, After] = binary:split(Html, <<"<", Tag/binary, ">">>),
    [Text, _] = binary:split(After, <<"</", Tag/binary, ">">>),
    ["'sha256-", base64:encode(crypto:hash(sha256, Text)), "'"].

%% @doc What the page shows, JSON-ready (binary keys, `null' for unknown).
-spec data() -> map().
data() ->
    Window = kem_dashboard_stats:window(),
    Snap = kem_metrics:snapshot(),
    Ports = [port(Name) || Name <- kem_sup:port_names()],
    #{<<"version">> => kem_version:app_vsn(),
      <<"window_s">> => kem_dashboard_stats:slot_seconds() * kem_dashboard_stats:window_slots(),
      <<"slot_s">> => kem_dashboard_stats:slot_seconds(),
      <<"max_kernels">> => kem_dashboard_stats:max_kernels(),
      <<"adapters">> => [adapter(G) || G <- kem_place:groups()],
      <<"ports">> => Ports,
      <<"spares">> => spares(),
      <<"kernels">> => kernels(Window),
      <<"errors">> => #{<<"window">> => by_name(maps:to_list(maps:get(errors, Window))),
                        <<"total">> => by_name([{R, N} || {{errors, R}, N} <- Snap])},
      <<"methods">> => by_name([{M, N} || {{calls, M}, N} <- Snap]),
      <<"quarantined">> => quarantined(),
      <<"sessions">> => #{<<"open">> => sum(<<"sessions">>, Ports), <<"bytes">> => sum(<<"session_bytes">>, Ports)},
      <<"memory">> => maps:from_list([{K, sum(K, Ports)} || K <- memory_keys()]),
      <<"cluster">> => cluster()}.

adapter(Group) ->
    #{<<"group">> => maps:get(group, Group),
      <<"adapter">> => null_for_undefined(maps:get(adapter, Group, undefined)),
      <<"name">> => text(maps:get(name, Group, <<>>)),
      <<"type">> => text(maps:get(type, Group, <<>>)),
      <<"state">> => atom_to_binary(maps:get(state, Group)),
      <<"ports">> => [atom_to_binary(P) || P <- maps:get(ports, Group)],
      <<"live">> => maps:get(live, Group),
      <<"pending">> => maps:get(pending, Group),
      <<"calls">> => maps:get(calls, Group),
      <<"errors">> => maps:get(errors, Group)}.

%% A port: up when its owner runs and it answers `health'. Its figures are
%% the port process's own (they start at zero with each new process).
port(Name) ->
    Health = case kem_port:call(Name, health, {}, ?PORT_TIMEOUT_MS) of
                 {ok, H} when is_map(H) -> H;
                 _ -> #{}
             end,
    Stats = case kem_port:call(Name, stats, {}, ?PORT_TIMEOUT_MS) of
                {ok, S} when is_map(S) -> S;
                _ -> #{}
            end,
    Up = whereis(Name) =/= undefined andalso map_size(Health) > 0,
    Figures = maps:from_list([{atom_to_binary(K), integer(maps:get(K, Stats, 0))}
                              || K <- [queue_depth, calls, sessions, session_bytes, pool_live_bytes,
                                       pool_idle_bytes, held_bytes, uptime_ms]]),
    Figures#{<<"name">> => atom_to_binary(Name),
             <<"group">> => null_for_undefined(kem_place:group_of(Name)),
             <<"up">> => Up,
             <<"usable">> => maps:get(usable, Health, false) =:= true,
             <<"kind">> => text(maps:get(kind, Health, <<"none">>)),
             <<"adapter">> => text(maps:get(adapter, Health, undefined)),
             <<"backend">> => text(maps:get(backend, Health, undefined)),
             <<"reason">> => text(maps:get(reason, Health, undefined))}.

%% Other kem nodes this one forwarded to or heard from (kem_cluster,
%% docs/cluster.md): what a front node without GPUs has to show. Node
%% names are on the metrics page already (`kem_remote_calls_total{node}').
cluster() ->
    Serving = kem_cluster:serving_nodes(),
    [#{<<"node">> => atom_to_binary(Node), <<"serving">> => lists:member(Node, Serving),
       <<"calls">> => Calls, <<"errors">> => maps:get(errors, S), <<"gone">> => maps:get(gone, S),
       <<"retries">> => maps:get(retries, S), <<"pending">> => maps:get(pending, S),
       <<"mean_ms">> => maps:get(latency_us, S) / max(1, Calls) / 1000,
       <<"ports">> => null_for_undefined(maps:get(ports, maps:get(reported, S, #{}), undefined))}
     || {Node, #{calls := Calls} = S} <- lists:sort(maps:to_list(kem_cluster:stats()))].

memory_keys() ->
    [<<"pool_live_bytes">>, <<"pool_idle_bytes">>, <<"session_bytes">>, <<"held_bytes">>].

sum(Key, Ports) -> lists:sum([maps:get(Key, P, 0) || P <- Ports]).

integer(N) when is_integer(N) -> N;
integer(_) -> 0.

spares() ->
    Info = try kem_spare:info() catch exit:_ -> [] end,
    [#{<<"group">> => G, <<"stage">> => atom_to_binary(Stage), <<"rss_kib">> => null_for_undefined(Rss)}
     || #{group := G, stage := Stage} = S <- Info, Rss <- [maps:get(rss_kib, S, undefined)]].

%% Kernels by calls over the window, most first; latency in ms.
kernels(#{kernels := Kernels, slot_elapsed_s := Elapsed}) ->
    Slots = kem_dashboard_stats:window_slots(),
    SlotS = kem_dashboard_stats:slot_seconds(),
    Sorted = lists:sort(fun(A, B) -> maps:get(calls, A) >= maps:get(calls, B) end, Kernels),
    [begin
         ByAge = maps:from_list(Series),
         %% Calls/s per slot, oldest first; the running slot by its elapsed part.
         Rates = [maps:get(Age, ByAge, 0) / slot_length(Age, Elapsed, SlotS) || Age <- lists:seq(Slots - 1, 0, -1)],
         Recent = lists:sum([maps:get(Age, ByAge, 0) || Age <- lists:seq(0, ?RATE_SLOTS - 1)]),
         #{<<"kernel">> => kernel_name(K), <<"other">> => K =:= other,
           <<"calls">> => Calls, <<"errors">> => Errors,
           <<"calls_per_s">> => Recent / ((?RATE_SLOTS - 1) * SlotS + max(1, Elapsed)),
           <<"mean_ms">> => SumUs / max(1, Calls) / 1000,
           <<"p50_ms">> => ms(kem_dashboard_stats:percentile(50, Buckets)),
           <<"p90_ms">> => ms(kem_dashboard_stats:percentile(90, Buckets)),
           <<"p99_ms">> => ms(kem_dashboard_stats:percentile(99, Buckets)),
           <<"series">> => Rates}
     end || #{kernel := K, calls := Calls, errors := Errors, sum_us := SumUs, series := Series,
              buckets := Buckets} <- Sorted].

slot_length(0, Elapsed, _SlotS) -> max(1, Elapsed);
slot_length(_Age, _Elapsed, SlotS) -> SlotS.

ms(null) -> null;
ms(Us) -> Us / 1000.

kernel_name(other) -> <<"(other)">>;
kernel_name(K) -> text(K).

%% Quarantined kernels with the seconds left, read from kem_quarantine's
%% public table (a kernel id, or `{chain, Id}' for chains only).
quarantined() ->
    Now = erlang:monotonic_time(millisecond),
    Rows = try ets:tab2list(kem_quarantine) catch error:badarg -> [] end,
    Live = lists:sublist(lists:sort([{Until, Key} || {Key, Until} <- Rows, Until > Now]), ?MAX_QUARANTINED),
    [#{<<"kernel">> => text(Id), <<"scope">> => Scope, <<"seconds_left">> => (Until - Now + 999) div 1000}
     || {Until, Key} <- Live, {Id, Scope} <- [scope(Key)]].

scope({chain, Id}) -> {Id, <<"chains">>};
scope(Id) -> {Id, <<"all calls">>}.

by_name(Pairs) ->
    maps:from_list([{text(K), N} || {K, N} <- Pairs]).

%% Text for JSON: valid UTF-8, node paths masked (kem_redact).
text(undefined) -> null;
text(A) when is_atom(A) -> atom_to_binary(A);
text(Other) -> kem_redact:text(Other).

null_for_undefined(undefined) -> null;
null_for_undefined(V) -> V.
