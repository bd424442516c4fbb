%%% @doc Soak test behind scripts/soak: many calls from many callers with
%%% random inputs and random example kernels, every answer checked against
%%% a reference computed here; memory and process counts before and after.
-module(kem_soak).
-export([run/2]).

-spec run(pos_integer(), pos_integer()) -> ok.
run(Calls, Callers) ->
    logger:set_primary_config(level, error),
    {ok, _} = application:ensure_all_started(kem),
    Warm = Calls div 10,
    _ = batch(Warm, Callers),  % warm-up: pipelines, pools
    Before = snapshot(),
    T0 = erlang:monotonic_time(millisecond),
    Totals = batch(Calls, Callers),
    Seconds = (erlang:monotonic_time(millisecond) - T0) / 1000,
    erlang:garbage_collect(),
    After = snapshot(),
    #{ok := Ok, wrong := Wrong, error := Err} = Totals,
    io:format("kem soak: ~b calls from ~b callers in ~.1f s (~.1f calls/s): ~b right, ~b wrong, ~b errors~n",
              [Calls, Callers, Seconds, Calls / Seconds, Ok, Wrong, Err]),
    io:format("kem soak: python RSS ~b -> ~b KiB (~.1f%); erlang processes ~b -> ~b; ports ~b -> ~b; "
              "erlang memory ~b -> ~b KiB~n",
              [maps:get(rss, Before), maps:get(rss, After),
               100 * (maps:get(rss, After) - maps:get(rss, Before)) / maps:get(rss, Before),
               maps:get(procs, Before), maps:get(procs, After), maps:get(ports, Before), maps:get(ports, After),
               maps:get(mem, Before), maps:get(mem, After)]),
    case Wrong + Err of
        0 -> ok;
        _ -> erlang:halt(1)
    end.

snapshot() ->
    [Port | _] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    {ok, Status} = file:read_file("/proc/" ++ integer_to_list(OsPid) ++ "/status"),
    {match, [Rss]} = re:run(Status, "VmRSS:\\s+(\\d+)", [{capture, all_but_first, list}]),
    #{rss => list_to_integer(Rss), procs => erlang:system_info(process_count),
      ports => erlang:system_info(port_count), mem => erlang:memory(total) div 1024}.

batch(Calls, Callers) ->
    Parent = self(),
    Per = Calls div Callers,
    Pids = [spawn_link(fun() -> Parent ! {self(), caller(Per + extra(I, Calls, Callers), #{ok => 0, wrong => 0, error => 0})} end)
            || I <- lists:seq(1, Callers)],
    lists:foldl(fun(Pid, Acc) ->
                    receive {Pid, R} -> maps:map(fun(K, V) -> V + maps:get(K, R) end, Acc) end
                end, #{ok => 0, wrong => 0, error => 0}, Pids).

extra(I, Calls, Callers) when I =< Calls rem Callers -> 1;
extra(_, _, _) -> 0.

caller(0, Acc) -> Acc;
caller(N, Acc) ->
    {Call, Expected} = case rand:uniform(3) of
        1 -> double_case();
        2 -> pixelize_case();
        3 -> glitch_case()
    end,
    Key = case Call() of
        {ok, Expected} -> ok;
        {ok, _} -> wrong;
        {error, _} -> error
    end,
    caller(N - 1, maps:update_with(Key, fun(V) -> V + 1 end, Acc)).

double_case() ->
    Input = crypto:strong_rand_bytes(rand:uniform(4096)),
    Hint = rand:uniform(3),
    {fun() -> kem:execute(<<"double">>, Input, #{output_size_hint => Hint}) end,
     kem_ref:double_ref(Input, byte_size(Input) * Hint)}.

%% An image of uniform blocks aligned to the pixel size: pixelize's block
%% means are the blocks' own colours, so the image comes back unchanged.
pixelize_case() ->
    {W, H, S} = {rand:uniform(48), rand:uniform(48), rand:uniform(6)},
    Colors = maps:from_list([{{Bx, By}, crypto:strong_rand_bytes(4)} || Bx <- lists:seq(0, W div S), By <- lists:seq(0, H div S)]),
    Image = << <<(maps:get({X div S, Y div S}, Colors))/binary>> || Y <- lists:seq(0, H - 1), X <- lists:seq(0, W - 1) >>,
    Params = <<W:32/little, H:32/little, S:32/little, 0:32>>,
    {fun() -> kem:execute(<<"pixelize">>, Image, #{params => Params}) end, Image}.

glitch_case() ->
    {W, H} = {rand:uniform(40), rand:uniform(40)},
    {Seed, Strength} = {rand:uniform(1 bsl 32) - 1, rand:uniform(30) - 1},
    Image = crypto:strong_rand_bytes(W * H * 4),
    Params = <<W:32/little, H:32/little, Seed:32/little, Strength:32/little>>,
    {fun() -> kem:execute(<<"glitch">>, Image, #{params => Params}) end, kem_ref:glitch_ref(Image, W, H, Seed, Strength)}.
